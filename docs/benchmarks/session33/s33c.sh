# call 3 of session 33: where the batch job's rank spends its GIL, CPU and wall time after a963b21 (pinned arena)
# (one rank, FP16 --decode gpu, 65536 500x375 JPEGs): py-spy --gil, py-spy (on CPU), py-spy --idle (every sample)
set -u
IMG=/tmp/imgs; python3 -c "
import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path; import batch_scaling
batch_scaling.make_images(Path('$IMG'), 65536, (500, 375))"
echo "images made"
job() {  # $1 tag, rest: prefix command
  tag=$1; shift
  rm -f /tmp/out-$tag.jsonl /tmp/out-$tag.errors.jsonl
  "$@" python3 -m vggserve batch --input $IMG --output /tmp/out-$tag.jsonl --device gpu \
    --batch-size 64 --no-progress --summary $OUT/summary-$tag.json --weights $VGGSERVE_WEIGHTS --precision fp16 \
    --decode gpu > $OUT/job-$tag.txt 2>&1; echo "$tag rc $?"
  python3 -c "import json; s=json.load(open('$OUT/summary-$tag.json')); r=s['ranks'][0]; print(round(s['images_per_second']), r.get('wait_ms_per_image'), r.get('cpu_ms_per_image'), s.get('decode_groups'))" | cut -c1-600
}
job plain
job gil py-spy record --gil --threads --rate 250 --format raw --nonblocking -o $OUT/gil.txt --
job cpu py-spy record --threads --rate 250 --format raw --nonblocking -o $OUT/cpu.txt --
job idle py-spy record --idle --threads --rate 250 --format raw --nonblocking -o $OUT/idle.txt --
