# call 4 of session 27: the service with replayed forward passes: 1 request in flight (replay on, off), and 256 in flight
set -u
say() { echo "=== $*" | tee -a "$OUT/log.txt"; }
for r in 1 0; do say service fp16 decode gpu, 1 in flight, VGGSERVE_REPLAY=$r
  VGGSERVE_REPLAY=$r timeout 170 python3 benchmarks/serve_saturation.py --weights $VGGSERVE_WEIGHTS --device gpu --decode gpu \
    --precision fp16 --max-batch-size 64 --concurrency 1 --client-procs 1 --duration 8 --warmup 3 --engine-seconds 4 \
    --json "$OUT/serve-c1-replay$r.json" > "$OUT/serve-c1-replay$r.txt" 2>&1; echo "rc $?"
  grep -E '^(engine|service|cpu|ratio)' "$OUT/serve-c1-replay$r.txt"; grep -v Warning "$OUT/serve-c1-replay$r.txt" | tail -3
done
say service fp16 decode gpu, 256 in flight
timeout 120 python3 benchmarks/serve_saturation.py --weights $VGGSERVE_WEIGHTS --device gpu --decode gpu \
  --precision fp16 --max-batch-size 64 --concurrency 256 --duration 10 --warmup 4 --engine-seconds 5 \
  --json "$OUT/serve-c256.json" > "$OUT/serve-c256.txt" 2>&1; echo "rc $?"
grep -E '^(engine|service|cpu|ratio)' "$OUT/serve-c256.txt"
