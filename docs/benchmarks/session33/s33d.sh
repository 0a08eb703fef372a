# call 4 of session 33: is the batch job's rank held by its GIL? (one rank, FP16 --decode gpu, 32768 JPEGs, in turn)
# base: this tree; sw05 / sw1: sys.setswitchinterval 0.5 / 1 ms; free: files preloaded (reads cost the threads nothing)
set -u
IMG=/tmp/imgs; python3 -c "
import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path; import batch_scaling
batch_scaling.make_images(Path('$IMG'), 32768, (500, 375))"
JOB="batch --input $IMG --device gpu --batch-size 64 --no-progress --weights $VGGSERVE_WEIGHTS --precision fp16 --decode gpu"
one() { echo "rm -f /tmp/o-\$\$.jsonl /tmp/o-\$\$.errors.jsonl && $1 timeout 90 python3 .whl/variant.py -- $JOB --output /tmp/o-\$\$.jsonl --summary {json}"; }
timeout 560 python3 benchmarks/in_turn.py --rounds 3 --json-key images_per_second --log-dir $OUT/turn --json $OUT/turn.json \
  --run base="$(one '')" --run sw05="$(one VARIANT_SWITCH=0.0005)" --run sw1="$(one VARIANT_SWITCH=0.001)" \
  --run free="$(one VARIANT_PRELOAD=1)" 2>&1 | tail -9
for f in $OUT/turn/*.json; do python3 -c "
import json,sys; s=json.load(open('$f')); r=s['ranks'][0]
print('$(basename $f)', round(s['images_per_second']), r.get('wait_ms_per_image'), r.get('cpu_ms_per_image'))"; done
grep -h preloaded $OUT/turn/free-*.txt
