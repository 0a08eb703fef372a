# call 7 of session 33: the final tree against issue 23's targets on one H200 (FP16, --decode gpu): the batch job
# (65,536 JPEGs), the service on 500x375 JPEGs and on the photo mix; native tests first
set -u
VGGSERVE_TEST_DEVICE=gpu timeout 100 python3 -m pytest -q -x tests/test_device_jpeg.py tests/test_filearena.py \
  -k "pinned or staged or started_ahead or chunks or reused or arena" 2>&1 | tail -2
timeout 420 python3 benchmarks/host_vs_engine.py --weights $VGGSERVE_WEIGHTS --device gpu --batch-size 64 \
  --precision fp16 --images 65536 --batch-decode gpu --runs batch,serve-gpu,photo-gpu --engine-seconds 5 \
  --duration 12 --warmup 3 --json $OUT/hve.json > $OUT/hve.txt 2>&1; echo "hve rc $?"; grep -E "^\||engine" $OUT/hve.txt | head -12
