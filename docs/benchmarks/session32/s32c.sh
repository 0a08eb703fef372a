# call 3 of session 32 (nvidia-h200-x2): the batch job's device-decode pipeline, one rank, FP16, 65536 500x375 JPEGs:
# tokens (chunks held), decode threads, group size and the starve rule, each run in turn with the default
set -u
IMG=/tmp/imgs; python3 -c "
import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path; import batch_scaling
batch_scaling.make_images(Path('$IMG'), 65536, (500, 375))"
v() {  # $1 tag, $2 tokens, $3 threads, $4 group, $5 starve
  rm -f /tmp/out.jsonl /tmp/out.errors.jsonl
  VGGSERVE_BATCH_TOKENS=$2 timeout 60 python3 .whl/batchvar.py $3 $4 $5 -- batch --input $IMG --output /tmp/out.jsonl \
    --device gpu --batch-size 64 --no-progress --summary $OUT/summary-$1.json --weights $VGGSERVE_WEIGHTS \
    --precision fp16 --decode gpu > $OUT/job-$1.txt 2>&1; rc=$?
  echo "$1 tokens $2 threads $3 group $4 starve $5 rc $rc: $(python3 -c "import json; s=json.load(open('$OUT/summary-$1.json')); print(round(s['images_per_second']), 'images/s, wall', s['wall_seconds'])") | $(grep -h 'waited\|decode_groups\|CPU ms' $OUT/job-$1.txt | tr -s ' ' | tr '\n' '|' | cut -c1-330)"
}
v d1 9 2 4 3
v t13 13 2 4 3
v t17 17 2 4 3
v th3 13 3 4 3
v g2 9 2 2 3
v s5 13 2 4 5
v d2 9 2 4 3
v t17b 17 2 4 3
v th3t17 17 3 4 3
v d3 9 2 4 3
