# call 3 of session 28: exact against gpu decoding, FP16, one H200 (16 cores): the batch job and the service, in turn
set -u
for mode in gpu exact gpu exact; do
  echo "=== service fp16 --decode $mode, 256 in flight"
  timeout 80 python3 benchmarks/serve_saturation.py --weights $VGGSERVE_WEIGHTS --device gpu --decode $mode \
    --precision fp16 --max-batch-size 64 --concurrency 256 --duration 8 --warmup 3 --engine-seconds 3 \
    --json "$OUT/serve-$mode.json" > "$OUT/serve-$mode.txt" 2>&1; echo "rc $?"
  grep -E '^(service|ratio|engine|cpu)' "$OUT/serve-$mode.txt" | cut -c1-200
done
for mode in exact gpu; do
  echo "=== batch job fp16 --decode $mode, 32768 JPEGs"
  timeout 170 python3 benchmarks/host_vs_engine.py --device gpu --batch-size 64 --precision fp16 --runs batch --batch-decode $mode \
    --images 32768 --engine-seconds 4 --json "$OUT/batch-$mode.json" > "$OUT/batch-$mode.txt" 2>&1; echo "rc $?"
  grep -v Warning "$OUT/batch-$mode.txt" | tail -8
done
