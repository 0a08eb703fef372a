# call 6 of session 33: decodes launched by the rank's thread before its submits (HEAD) against HEAD~1, in turn;
# one rank (group 4, and group 2 with launches), then two ranks; native tests first
set -u
mkdir -p /tmp/old && tar -xf .whl/old.tar -C /tmp/old
NEW=$PWD
VGGSERVE_TEST_DEVICE=gpu timeout 120 python3 -m pytest -q -x tests/test_device_jpeg.py tests/test_decode_launches.py \
  -k "pinned or staged or started_ahead or chunks or reused or threads or launch" 2>&1 | tail -2
IMG=/tmp/imgs; python3 -c "
import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path; import batch_scaling
batch_scaling.make_images(Path('$IMG'), 32768, (500, 375))"
JOB="batch --input $IMG --device gpu --batch-size 64 --no-progress --weights $VGGSERVE_WEIGHTS --precision fp16 --decode gpu"
MPI="mpiexec -n 2 --bind-to none --allow-run-as-root --oversubscribe"
one() { echo "cd $1 && rm -f /tmp/o-\$\$.jsonl /tmp/o-\$\$.errors.jsonl && PYTHONPATH=/tmp/site:$1 timeout 90 $2 python3 $3 $JOB --output /tmp/o-\$\$.jsonl --summary {json}"; }
timeout 330 python3 benchmarks/in_turn.py --rounds 3 --json-key images_per_second --log-dir $OUT/turn1 --json $OUT/turn1.json \
  --run old="$(one /tmp/old '' '-m vggserve')" --run new="$(one $NEW '' '-m vggserve')" \
  --run new_g2="$(one $NEW '' "$NEW/.whl/batchvar.py 2 2 5 --")" 2>&1 | tail -6
for f in $OUT/turn1/*.json; do python3 -c "
import json,sys; s=json.load(open('$f')); r=s['ranks'][0]
print('$(basename $f)', round(s['images_per_second']), r.get('wait_ms_per_image'), r.get('cpu_ms_per_image'), r.get('decode_groups', {}).get('launched'))"; done
timeout 170 python3 benchmarks/in_turn.py --rounds 2 --json-key images_per_second --log-dir $OUT/turn2 --json $OUT/turn2.json \
  --run old2="$(one /tmp/old "$MPI" '-m vggserve')" --run new2="$(one $NEW "$MPI" '-m vggserve')" 2>&1 | tail -5
