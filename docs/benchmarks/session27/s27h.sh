# call 9 of session 27: the service with more requests in flight (decode groups) at FP16 (and a decode hold); a recording's cost; the mended test
set -u
say() { echo "=== $*" | tee -a "$OUT/log.txt"; }
say mended test natively
VGGSERVE_TEST_DEVICE=gpu timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py -k test_a_tuned_entry_for_the_other 2>&1 | tail -1
say launch_cost fp16,fp8 with a recording timed
timeout 100 python3 benchmarks/launch_cost.py --precisions fp16,fp8 --iterations 300 --json "$OUT/launch_cost.json" 2>&1 | grep -v Warning | grep -v lambda | grep replayed
for spec in "fp16 512 0" "fp16 1024 0" "fp16 1024 2"; do set -- $spec
  say service $1 decode gpu, $2 in flight, VGGSERVE_DECODE_HOLD_MS=$3
  VGGSERVE_DECODE_HOLD_MS=$3 timeout 110 python3 benchmarks/serve_saturation.py --weights $VGGSERVE_WEIGHTS --device gpu --decode gpu \
    --precision $1 --max-batch-size 64 --concurrency $2 --duration 10 --warmup 4 --engine-seconds 5 \
    --json "$OUT/serve-$1-c$2-h$3.json" > "$OUT/serve-$1-c$2-h$3.txt" 2>&1; echo "rc $?"
  grep -E '^(engine|service|cpu|ratio)' "$OUT/serve-$1-c$2-h$3.txt"
done
