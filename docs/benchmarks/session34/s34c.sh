# call 3 of session 34: the decoder's kernels after the IDCT, colour and resize cuts: device_decode's device ms per
# kernel against 5ef94b9 in turn (twice), the batch job one rank in turn (3 rounds), then host_vs_engine
set -u
mkdir -p /tmp/old && tar -xf .whl/old.tar -C /tmp/old
NEW=$PWD
VGGSERVE_TEST_DEVICE=gpu timeout 120 python3 -m pytest -q -x tests/test_resize.py 2>&1 | tail -1
dd() { # name dir group extra...
  local name=$1 dir=$2 g=$3; shift 3
  (cd $dir && PYTHONPATH=/tmp/site:$dir timeout 150 python3 $dir/benchmarks/device_decode.py --device gpu --images 512 \
     --batch 64 --seconds 3 --no-torch --group $g "$@" --json $OUT/$name.json > $OUT/$name.txt 2>&1); echo "$name rc $?"
  grep -E "device ms per batch of 64 \(" $OUT/$name.txt | head -1
}
for rep in 1 2; do dd old-g4-$rep /tmp/old 4; dd new-g4-$rep $NEW 4; done
IMG=/tmp/imgs; python3 -c "
import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path; import batch_scaling
batch_scaling.make_images(Path('$IMG'), 32768, (500, 375))"
JOB="batch --input $IMG --device gpu --batch-size 64 --no-progress --weights $VGGSERVE_WEIGHTS --precision fp16 --decode gpu"
one() { echo "cd $1 && rm -f /tmp/o-\$\$.jsonl /tmp/o-\$\$.errors.jsonl && PYTHONPATH=/tmp/site:$1 timeout 90 python3 -m vggserve $JOB --output /tmp/o-\$\$.jsonl --summary {json}"; }
timeout 300 python3 benchmarks/in_turn.py --rounds 3 --json-key images_per_second --log-dir $OUT/turn1 --json $OUT/turn1.json \
  --run old="$(one /tmp/old)" --run new="$(one $NEW)" 2>&1 | tail -8
timeout 170 python3 benchmarks/host_vs_engine.py --weights $VGGSERVE_WEIGHTS --device gpu --batch-size 64 \
  --precision fp16 --images 32768 --batch-decode gpu --runs batch,serve-gpu --engine-seconds 5 --duration 12 \
  --warmup 3 --json $OUT/hve.json > $OUT/hve.txt 2>&1; echo "hve rc $?"; grep -E "^\||engine" $OUT/hve.txt | head -8
cd $OUT && tar -czf all.tgz *.txt *.json turn1 && rm -rf *.json turn1
