# call 6 of session 35: on top of 7b12d05 (head2): V1 the refill's 4 bytes loaded a refill ahead, V2 the block's
# tables found at every step (no branch at block starts), V12 both (this tree): a warp's latency, device ms per batch
set -u
NEW=$PWD
mk() { rm -rf /tmp/$1 && mkdir -p /tmp/$1 && cp -r benchmarks vggserve kernels pyproject.toml /tmp/$1/ && cp .whl/v/$1_entropy.cl /tmp/$1/kernels/jpeg_entropy.cl; }
mk head2; mk v2
timeout 150 python3 benchmarks/entropy_latency.py --device gpu --against .whl/v/head2_entropy.cl --against .whl/v/v1_entropy.cl \
  --against .whl/v/v2_entropy.cl > $OUT/lat.txt 2>&1; echo "lat rc $?"; grep "round 0" $OUT/lat.txt | cut -c1-330
dd() { # name dir group extra...
  local name=$1 dir=$2 g=$3; shift 3
  (cd $dir && PYTHONPATH=/tmp/site:$dir timeout 100 python3 $dir/benchmarks/device_decode.py --device gpu --images 512 \
     --batch 64 --seconds 2 --no-torch --group $g "$@" --json $OUT/$name.json > $OUT/$name.txt 2>&1); echo "$name rc $?"
  grep -E "identical|device ms per batch of 64 \(" $OUT/$name.txt | head -2
  python3 -c "import json; d=json.load(open('$OUT/$name.json')); print('rounds', [round(x,3) for x in d['sync_round_ms']][:9])"
}
for g in 1 4; do dd head2-g$g /tmp/head2 $g; dd v12-g$g $NEW $g; dd v2-g$g /tmp/v2 $g; dd head2b-g$g /tmp/head2 $g; dd v12b-g$g $NEW $g; done
VGGSERVE_TEST_DEVICE=gpu timeout 150 python3 -m pytest -q -x tests/test_device_jpeg.py 2>&1 | tail -1
cd $OUT && tar -czf all.tgz *.txt *.json && rm -f *.json
