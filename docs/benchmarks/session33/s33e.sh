# call 5 of session 33: the batch job's decode group (one rank, FP16 --decode gpu, 32768 JPEGs, in turn): 4 (the
# default), 3, 2 chunks per launch sequence (batchvar.py THREADS GROUP STARVE; tokens follow rank_tokens)
set -u
IMG=/tmp/imgs; python3 -c "
import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path; import batch_scaling
batch_scaling.make_images(Path('$IMG'), 32768, (500, 375))"
JOB="batch --input $IMG --device gpu --batch-size 64 --no-progress --weights $VGGSERVE_WEIGHTS --precision fp16 --decode gpu"
one() { echo "rm -f /tmp/o-\$\$.jsonl /tmp/o-\$\$.errors.jsonl && timeout 90 python3 .whl/batchvar.py $1 -- $JOB --output /tmp/o-\$\$.jsonl --summary {json}"; }
timeout 500 python3 benchmarks/in_turn.py --rounds 3 --json-key images_per_second --log-dir $OUT/turn --json $OUT/turn.json \
  --run g4="$(one '2 4 5')" --run g3="$(one '2 3 5')" --run g2="$(one '2 2 5')" --run g2s4="$(one '2 2 4')" 2>&1 | tail -9
for f in $OUT/turn/*.json; do python3 -c "
import json,sys; s=json.load(open('$f')); r=s['ranks'][0]
print('$(basename $f)', round(s['images_per_second']), r.get('wait_ms_per_image'), r.get('cpu_ms_per_image'), s.get('decode_groups', r.get('decode_groups')))" | cut -c1-300; done
