# call 9 of session 28: the same A/B at 512 requests in flight (room for a batch waiting while one is decoded)
set -u
mkdir -p /tmp/old && tar -xf .whl/old.tar -C /tmp/old
run() { # name, tree
  echo "=== service fp16 decode gpu 512 in flight, $1"
  ( cd $2 && PYTHONPATH=/tmp/site:$2 timeout 55 python3 benchmarks/serve_saturation.py --weights $VGGSERVE_WEIGHTS --device gpu --decode gpu \
    --precision fp16 --max-batch-size 64 --concurrency 512 --duration 6 --warmup 3 --skip-engine \
    --json "$OUT/serve-$1.json" > "$OUT/serve-$1.txt" 2>&1; echo "rc $?" )
  grep -E '^(service)' "$OUT/serve-$1.txt" | cut -c1-160
}
run new-0 $PWD
run old-1 /tmp/old
run new-2 $PWD
