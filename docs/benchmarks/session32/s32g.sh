# call 7 of session 32 (nvidia-h200-x2): the batch job's device-decode threads per rank (THREADS 2, the default,
# against 3 and 4), one rank and two (mpirun), FP16 --decode gpu, 32768 JPEGs, defaults otherwise (b758d27), in turn
set -u
IMG=/tmp/imgs; python3 -c "
import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path; import batch_scaling
batch_scaling.make_images(Path('$IMG'), 32768, (500, 375))"
v() {  # $1 tag, $2 ranks, $3 threads
  rm -f /tmp/out.jsonl /tmp/out.errors.jsonl
  timeout 60 mpirun -n $2 --bind-to none --allow-run-as-root --oversubscribe python3 .whl/batchvar.py $3 4 5 -- batch \
    --input $IMG --output /tmp/out.jsonl --device gpu --batch-size 64 --no-progress --summary $OUT/summary-$1.json \
    --weights $VGGSERVE_WEIGHTS --precision fp16 --decode gpu > $OUT/job-$1.txt 2>&1; rc=$?
  echo "$1 ranks $2 threads $3 rc $rc: $(python3 -c "import json; s=json.load(open('$OUT/summary-$1.json')); print(round(s['images_per_second']), 'images/s, wall', s['wall_seconds'])") | $(grep -h 'waited' $OUT/job-$1.txt | tr -s ' ' | tr '\n' '|' | cut -c1-250)"
}
for r in 1 2; do
  v r1t2-$r 1 2
  v r1t3-$r 1 3
  v r2t2-$r 2 2
  v r2t3-$r 2 3
  v r2t4-$r 2 4
done
