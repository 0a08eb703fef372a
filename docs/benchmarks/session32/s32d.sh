# call 4 of session 32 (nvidia-h200-x2): the batch job, one rank, FP16 --decode gpu, 65536 JPEGs: the FileArena reads
# (this tree) against f733279 (read_source), in turn, and this tree with STARVE_BELOW 5 and 13 tokens
set -u
mkdir -p /tmp/old && tar -xf .whl/old.tar -C /tmp/old
NEW=$PWD
IMG=/tmp/imgs; python3 -c "
import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path; import batch_scaling
batch_scaling.make_images(Path('$IMG'), 65536, (500, 375))"
v() {  # $1 tag, $2 tree, $3 tokens, $4 threads, $5 group, $6 starve
  rm -f /tmp/out.jsonl /tmp/out.errors.jsonl
  (cd $2 && VGGSERVE_BATCH_TOKENS=$3 PYTHONPATH=/tmp/site:$2 timeout 60 python3 $NEW/.whl/batchvar.py $4 $5 $6 -- batch \
    --input $IMG --output /tmp/out.jsonl --device gpu --batch-size 64 --no-progress --summary $OUT/summary-$1.json \
    --weights $VGGSERVE_WEIGHTS --precision fp16 --decode gpu > $OUT/job-$1.txt 2>&1); rc=$?
  echo "$1 tokens $3 threads $4 group $5 starve $6 rc $rc: $(python3 -c "import json; s=json.load(open('$OUT/summary-$1.json')); print(round(s['images_per_second']), 'images/s, wall', s['wall_seconds'])") | $(grep -h 'vggserve from\|waited\|CPU ms' $OUT/job-$1.txt | tr -s ' ' | tr '\n' '|' | cut -c1-250)"
}
for r in 1 2 3; do
  v old$r /tmp/old 9 2 4 3
  v new$r $NEW 9 2 4 3
  v s5-$r $NEW 13 2 4 5
done
