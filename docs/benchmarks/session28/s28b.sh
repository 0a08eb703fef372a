# call 2 of session 28: the FP16 service on the H200, --decode gpu against auto (the front ends decode while a thread is idle)
set -u
run() { # name, extra args
  echo "=== service fp16 $1, 256 in flight"
  timeout 80 python3 benchmarks/serve_saturation.py --weights $VGGSERVE_WEIGHTS --device gpu \
    --precision fp16 --max-batch-size 64 --concurrency 256 --duration 8 --warmup 3 --engine-seconds 3 "${@:2}" \
    --json "$OUT/serve-$1.json" > "$OUT/serve-$1.txt" 2>&1; echo "rc $?"
  grep -E '^(service|ratio|engine|front|cpu|decoded)' "$OUT/serve-$1.txt" | cut -c1-220
}
run gpu-0 --decode gpu
run auto-1 --decode auto
run gpu-2 --decode gpu
run auto-3 --decode auto
run auto-t2-4 --decode auto --preprocess-threads 2
run auto-t3-5 --decode auto --preprocess-threads 3
