# call 4 of session 35: je_run's symbol step with the single- and multi-symbol lookups made side by side and the
# result chosen by selects ("merge"), against this tree (7934a14+): a warp's latency, device ms per batch in turn
set -u
NEW=$PWD
rm -rf /tmp/merge && mkdir -p /tmp/merge && cp -r benchmarks vggserve kernels tests pyproject.toml /tmp/merge/ && cp .whl/v/merge_entropy.cl /tmp/merge/kernels/jpeg_entropy.cl
timeout 150 python3 .whl/v/lat2.py --device gpu --against .whl/v/merge_entropy.cl > $OUT/lat.txt 2>&1; echo "lat rc $?"; tail -3 $OUT/lat.txt
dd() { # name dir group extra...
  local name=$1 dir=$2 g=$3; shift 3
  (cd $dir && PYTHONPATH=/tmp/site:$dir timeout 150 python3 $dir/benchmarks/device_decode.py --device gpu --images 512 \
     --batch 64 --seconds 3 --no-torch --group $g "$@" --json $OUT/$name.json > $OUT/$name.txt 2>&1); echo "$name rc $?"
  grep -E "identical|device ms per batch of 64 \(|ahead|engine alone" $OUT/$name.txt | head -4
  python3 -c "import json; d=json.load(open('$OUT/$name.json')); print('rounds', [round(x,3) for x in d['sync_round_ms']][:10])"
}
for rep in 1 2; do for g in 4 1; do dd tree-g$g-$rep $NEW $g; dd merge-g$g-$rep /tmp/merge $g; done; done
(cd /tmp/merge && VGGSERVE_TEST_DEVICE=gpu timeout 200 python3 -m pytest -q -x tests/test_device_jpeg.py 2>&1 | tail -1)
VGGSERVE_TEST_DEVICE=gpu timeout 200 python3 -m pytest -q -x tests/test_device_jpeg.py tests/test_decode_groups.py tests/test_resize.py 2>&1 | tail -1
cd $OUT && tar -czf all.tgz *.txt *.json && rm -f *.json
