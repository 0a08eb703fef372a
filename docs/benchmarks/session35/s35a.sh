# call 1 of session 35: jpeg_sync's lockstep decode (je_sync_run) against 7af81d8's je_run: one chunk's latency and a
# warp's (entropy_latency), device ms per batch (device_decode g4, g1 in turn, twice), with the network, native tests
set -u
mkdir -p /tmp/old && tar -xf .whl/old.tar -C /tmp/old
NEW=$PWD
timeout 150 python3 benchmarks/entropy_latency.py --device gpu --against .whl/v/head_entropy.cl > $OUT/lat.txt 2>&1; echo "lat rc $?"; tail -4 $OUT/lat.txt
dd() { # name dir group extra...
  local name=$1 dir=$2 g=$3; shift 3
  (cd $dir && PYTHONPATH=/tmp/site:$dir timeout 150 python3 $dir/benchmarks/device_decode.py --device gpu --images 512 \
     --batch 64 --seconds 3 --no-torch --group $g "$@" --json $OUT/$name.json > $OUT/$name.txt 2>&1); echo "$name rc $?"
  grep -E "identical|device ms per batch of 64 \(|ahead|engine alone" $OUT/$name.txt | head -4
  python3 -c "import json; d=json.load(open('$OUT/$name.json')); print('rounds', [round(x,3) for x in d['sync_round_ms']][:10])"
}
for rep in 1 2; do for g in 4 1; do dd old-g$g-$rep /tmp/old $g; dd new-g$g-$rep $NEW $g; done; done
for g in 1; do dd oldnet-g$g /tmp/old $g --network fp16; dd newnet-g$g $NEW $g --network fp16; done
VGGSERVE_TEST_DEVICE=gpu timeout 200 python3 -m pytest -q -x tests/test_device_jpeg.py 2>&1 | tail -2
cd $OUT && tar -czf all.tgz *.txt *.json && rm -f *.json
