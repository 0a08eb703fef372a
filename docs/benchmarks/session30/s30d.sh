# call 4 of session 30 (nvidia-h200-x2): are the front ends the limit on two H200s? (auto gives 8 for one GPU, 12 for two)
set -u
run() {  # $1 tag, $2 device, $3 concurrency, $4 http workers
  echo "=== service fp16 --decode gpu --device $2, $3 in flight, --http-workers $4"
  timeout 100 python3 benchmarks/serve_saturation.py --weights $VGGSERVE_WEIGHTS --device $2 --decode gpu --precision fp16 \
    --max-batch-size 64 --concurrency $3 --duration 10 --warmup 3 --skip-engine --http-workers $4 \
    --json "$OUT/serve-$1.json" > "$OUT/serve-$1.txt" 2>&1; echo "rc $?"
  grep -E '^(service|cpu)' "$OUT/serve-$1.txt" | cut -c1-250
}
run all-16 all 512 16
run all-20 all 512 20
run one-12 gpu 256 12
run all-12 all 512 12
run one-8 gpu 256 8
run all-16b all 512 16
