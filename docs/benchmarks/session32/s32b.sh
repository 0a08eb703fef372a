# call 2 of session 32 (nvidia-h200-x2): where the batch job's rank spends its GIL and CPU at FP16 with --decode gpu
# (one rank, 32768 500x375 JPEGs): a plain run, then py-spy --gil (GIL holders) and py-spy (on-CPU threads)
set -u
IMG=/tmp/imgs; python3 -c "
import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path; import batch_scaling
batch_scaling.make_images(Path('$IMG'), 32768, (500, 375))"
echo "images made"
job() {  # $1 tag, rest: prefix command
  tag=$1; shift
  rm -f /tmp/out-$tag.jsonl /tmp/out-$tag.errors.jsonl
  "$@" python3 -m vggserve batch --input $IMG --output /tmp/out-$tag.jsonl --device gpu \
    --batch-size 64 --no-progress --summary $OUT/summary-$tag.json --weights $VGGSERVE_WEIGHTS --precision fp16 \
    --decode gpu > $OUT/job-$tag.txt 2>&1; echo "$tag rc $?"
  tail -3 $OUT/job-$tag.txt
  python3 -c "import json; s=json.load(open('$OUT/summary-$tag.json')); print({k: s[k] for k in s if k not in ('ranks',)})" | cut -c1-1500
}
job plain
job gil py-spy record --gil --threads --rate 250 --format raw --nonblocking -o $OUT/gil.txt --
job cpu py-spy record --threads --rate 250 --format raw --nonblocking -o $OUT/cpu.txt --
job plain2
