# call 13 of session 27: the service again, twice, on the machine call 12 started (its first service runs low)
set -u
for i in 1 2; do echo "=== service fp16 decode gpu, 256 in flight, run $i"
timeout 75 python3 benchmarks/serve_saturation.py --weights $VGGSERVE_WEIGHTS --device gpu --decode gpu \
  --precision fp16 --max-batch-size 64 --concurrency 256 --duration 8 --warmup 3 --engine-seconds 4 \
  --json "$OUT/serve-c256-$i.json" > "$OUT/serve-c256-$i.txt" 2>&1; echo "rc $?"
grep -E '^(service|ratio)' "$OUT/serve-c256-$i.txt" | cut -c1-200
done
