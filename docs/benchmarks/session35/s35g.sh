# call 7 of session 35: the final kernel (b79d332: je_code and je_value shared): native tests, device ms per batch
set -u
VGGSERVE_TEST_DEVICE=gpu timeout 150 python3 -m pytest -q -x tests/test_device_jpeg.py tests/test_decode_groups.py tests/test_serving_device_decode.py tests/test_engine_raw_images.py tests/test_resize.py 2>&1 | tail -1
for g in 1 4; do
  timeout 60 python3 benchmarks/device_decode.py --device gpu --images 512 --batch 64 --seconds 2 --no-torch --group $g \
    --json $OUT/final-g$g.json > $OUT/final-g$g.txt 2>&1; echo "g$g rc $?"; grep -E "identical|device ms per batch of 64 \(" $OUT/final-g$g.txt | head -2
done
