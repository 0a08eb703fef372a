# call 12 of session 27: the warm-up's recordings (Engine.prepare_replays) natively and in the service
set -u
say() { echo "=== $*" | tee -a "$OUT/log.txt"; }
say native tests
VGGSERVE_TEST_DEVICE=gpu timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_engine_replay.py tests/test_cmdbuf.py \
  tests/test_benchmark_reports.py -k "replay or cmdbuf or command_buffer or launch_cost or warm_up or prepare or kernel" -rf 2>&1 \
  | grep -E "^(FAILED|ERROR)|passed|failed" | tail -5 | tee -a "$OUT/log.txt"
say service fp16 decode gpu, 256 in flight
timeout 110 python3 benchmarks/serve_saturation.py --weights $VGGSERVE_WEIGHTS --device gpu --decode gpu \
  --precision fp16 --max-batch-size 64 --concurrency 256 --duration 8 --warmup 3 --engine-seconds 4 \
  --json "$OUT/serve-c256.json" > "$OUT/serve-c256.txt" 2>&1; echo "rc $?"
grep -E '^(engine|service|cpu|ratio)' "$OUT/serve-c256.txt"; grep -i 'warmed up\|record' "$OUT/serve-c256.txt" | head -3
