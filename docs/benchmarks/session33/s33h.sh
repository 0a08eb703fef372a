# call 8 of session 33: the pinned arena again (HEAD against d6e6426), one rank, 4 rounds in turn, 32768 JPEGs
set -u
mkdir -p /tmp/old && tar -xf .whl/old.tar -C /tmp/old
NEW=$PWD
IMG=/tmp/imgs; python3 -c "
import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path; import batch_scaling
batch_scaling.make_images(Path('$IMG'), 32768, (500, 375))"
JOB="batch --input $IMG --device gpu --batch-size 64 --no-progress --weights $VGGSERVE_WEIGHTS --precision fp16 --decode gpu"
one() { echo "cd $1 && rm -f /tmp/o-\$\$.jsonl /tmp/o-\$\$.errors.jsonl && PYTHONPATH=/tmp/site:$1 timeout 90 python3 -m vggserve $JOB --output /tmp/o-\$\$.jsonl --summary {json}"; }
timeout 400 python3 benchmarks/in_turn.py --rounds 4 --json-key images_per_second --log-dir $OUT/turn --json $OUT/turn.json \
  --run old="$(one /tmp/old)" --run new="$(one $NEW)" 2>&1 | tail -5
for f in $OUT/turn/*.json; do python3 -c "
import json,sys; s=json.load(open('$f')); r=s['ranks'][0]
print('$(basename $f)', round(s['images_per_second']), r.get('wait_ms_per_image'), r.get('cpu_ms_per_image'))"; done
