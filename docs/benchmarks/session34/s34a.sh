# call 1 of session 34: the IDCT in 32-bit arithmetic and packed synchronisation rounds: native tests, then
# device_decode's device ms per kernel, this tree against 5ef94b9 (session 33's), groups 4 and 1, then with the network
set -u
mkdir -p /tmp/old && tar -xf .whl/old.tar -C /tmp/old
NEW=$PWD
VGGSERVE_TEST_DEVICE=gpu timeout 200 python3 -m pytest -q -x tests/test_device_jpeg.py 2>&1 | tail -3
dd() { # name dir group extra...
  local name=$1 dir=$2 g=$3; shift 3
  (cd $dir && PYTHONPATH=/tmp/site:$dir timeout 150 python3 $dir/benchmarks/device_decode.py --device gpu --images 512 \
     --batch 64 --seconds 3 --no-torch --group $g "$@" --json $OUT/$name.json > $OUT/$name.txt 2>&1); echo "$name rc $?"
  grep -E "identical|device ms per batch of 64 \(|ahead|engine alone" $OUT/$name.txt | head -4
}
for g in 4 1; do dd old-g$g /tmp/old $g; dd new-g$g $NEW $g; dd nocompact-g$g $NEW $g --no-compact; done
for g in 2 1; do dd oldnet-g$g /tmp/old $g --network fp16; dd newnet-g$g $NEW $g --network fp16; done
