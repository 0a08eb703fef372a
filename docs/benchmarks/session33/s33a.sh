# call 1 of session 33 (nvidia-h200-x2): files read into pinned memory and uploaded from there (no join_into copy):
# native tests, then the batch job one rank and two ranks, this tree against d6e6426, in turn; then host_vs_engine
set -u
mkdir -p /tmp/old && tar -xf .whl/old.tar -C /tmp/old
NEW=$PWD
VGGSERVE_TEST_DEVICE=gpu timeout 150 python3 -m pytest -q -x tests/test_device_jpeg.py tests/test_filearena.py \
  -k "pinned or staged or started_ahead or chunks or reused or threads or arena" 2>&1 | tail -3
IMG=/tmp/imgs; python3 -c "
import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path; import batch_scaling
batch_scaling.make_images(Path('$IMG'), 32768, (500, 375))"
echo "images made $(ls $IMG | wc -l)"
JOB="batch --input $IMG --device gpu --batch-size 64 --no-progress --weights $VGGSERVE_WEIGHTS --precision fp16 --decode gpu"
MPI="mpiexec -n 2 --bind-to none --allow-run-as-root --oversubscribe"
one() { echo "cd $1 && rm -f /tmp/o-\$\$.jsonl /tmp/o-\$\$.errors.jsonl && PYTHONPATH=/tmp/site:$1 timeout 90 $2 python3 -m vggserve $JOB --output /tmp/o-\$\$.jsonl --summary {json}"; }
timeout 330 python3 benchmarks/in_turn.py --rounds 3 --json-key images_per_second --log-dir $OUT/turn1 --json $OUT/turn1.json \
  --run old="$(one /tmp/old '')" --run new="$(one $NEW '')" 2>&1 | tail -12
for f in $OUT/turn1/*.json; do python3 -c "
import json,sys; s=json.load(open('$f')); r=s['ranks'][0]
print('$(basename $f)', round(s['images_per_second']), r.get('wait_ms_per_image'), r.get('cpu_ms_per_image'))"; done
timeout 200 python3 benchmarks/in_turn.py --rounds 2 --json-key images_per_second --log-dir $OUT/turn2 --json $OUT/turn2.json \
  --run old2="$(one /tmp/old "$MPI")" --run new2="$(one $NEW "$MPI")" 2>&1 | tail -8
timeout 120 python3 benchmarks/host_vs_engine.py --weights $VGGSERVE_WEIGHTS --device gpu --batch-size 64 \
  --precision fp16 --images 32768 --batch-decode gpu --runs batch --engine-seconds 5 --json $OUT/hve.json \
  > $OUT/hve.txt 2>&1; echo "hve rc $?"; grep -E "^\||engine" $OUT/hve.txt | head -8
