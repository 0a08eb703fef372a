# call 6 of session 30 (nvidia-h200-x2): two lanes (4 batches in flight per device) against one, one GPU and two, in turn
set -u
run() {  # $1 tag, $2 device, $3 concurrency, $4 lanes
  echo "=== service fp16 --decode gpu --device $2, $3 in flight, --lanes $4"
  timeout 100 python3 benchmarks/serve_saturation.py --weights $VGGSERVE_WEIGHTS --device $2 --decode gpu --precision fp16 \
    --max-batch-size 64 --concurrency $3 --duration 10 --warmup 3 --skip-engine --lanes $4 \
    --json "$OUT/serve-$1.json" > "$OUT/serve-$1.txt" 2>&1; echo "rc $?"
  grep -E '^(service|cpu)' "$OUT/serve-$1.txt" | cut -c1-200
}
run all-l2 all 512 2
run one-l2 gpu 256 2
run all-l1 all 512 1
run one-l1 gpu 256 1
run all-l2b all 512 2
