# call 5 of session 28: the service, FP16, --decode gpu, 256 in flight: the next batch taken early after every device-decoded
# batch (this tree) against 865d814 (only after a group), in turn
set -u
mkdir -p /tmp/old && tar -xf .whl/old.tar -C /tmp/old
run() { # name, tree
  echo "=== service fp16 decode gpu, $1"
  ( cd $2 && PYTHONPATH=/tmp/site:$2 timeout 80 python3 benchmarks/serve_saturation.py --weights $VGGSERVE_WEIGHTS --device gpu --decode gpu \
    --precision fp16 --max-batch-size 64 --concurrency ${3:-256} --duration 8 --warmup 3 --engine-seconds 3 \
    --json "$OUT/serve-$1.json" > "$OUT/serve-$1.txt" 2>&1; echo "rc $?" )
  grep -E '^(service|ratio|engine|cpu)' "$OUT/serve-$1.txt" | cut -c1-200
}
run new-0 $PWD
run old-1 /tmp/old
run new-2 $PWD
run old-3 /tmp/old
run new-4 $PWD
run old-5 /tmp/old
