# call 2 of session 34: the IDCT at 8 work-items per block, the colour kernel's 4:2:0 quads, quiet rounds skipped:
# native tests, then device_decode's device ms per kernel, this tree against 5ef94b9, groups 4 and 1 (in turn, twice)
set -u
mkdir -p /tmp/old && tar -xf .whl/old.tar -C /tmp/old
NEW=$PWD
VGGSERVE_TEST_DEVICE=gpu timeout 200 python3 -m pytest -q -x tests/test_device_jpeg.py 2>&1 | tail -2
dd() { # name dir group extra...
  local name=$1 dir=$2 g=$3; shift 3
  (cd $dir && PYTHONPATH=/tmp/site:$dir timeout 150 python3 $dir/benchmarks/device_decode.py --device gpu --images 512 \
     --batch 64 --seconds 3 --no-torch --group $g "$@" --json $OUT/$name.json > $OUT/$name.txt 2>&1); echo "$name rc $?"
  grep -E "identical|device ms per batch of 64 \(|ahead|engine alone" $OUT/$name.txt | head -4
}
for rep in 1 2; do for g in 4 1; do dd old-g$g-$rep /tmp/old $g; dd new-g$g-$rep $NEW $g; done; done
dd noskip-g1 $NEW 1 --no-skip-quiet
for g in 2 1; do dd oldnet-g$g /tmp/old $g --network fp16; dd newnet-g$g $NEW $g --network fp16; done
cd $OUT && tar -czf all.tgz *.txt *.json && rm -f *.json
