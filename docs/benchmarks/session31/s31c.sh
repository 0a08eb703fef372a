# call 3 of session 31 (nvidia-h200-x2): provisional decode (46ebb20) against early take alone (492380f), interleaved, then --gil on each
set -u
mkdir -p /tmp/new /tmp/s1 && tar -xf .whl/new.tar -C /tmp/new && tar -xf .whl/s1.tar -C /tmp/s1
serve() {  # $1 tag, $2 tree, $3 device, $4 concurrency, $5 extra
  echo "=== $1: service fp16 --decode gpu --device $3, $4 in flight $5"
  (cd $2 && PYTHONPATH=/tmp/site:$2 timeout 80 python3 benchmarks/serve_saturation.py --weights $VGGSERVE_WEIGHTS \
    --device $3 --decode gpu --precision fp16 --max-batch-size 64 --concurrency $4 --duration 8 --warmup 3 \
    --skip-engine $5 --json "$OUT/serve-$1.json" > "$OUT/serve-$1.txt" 2>&1); echo "rc $?"
  grep -E '^(service|cpu|threads|gil|  )' "$OUT/serve-$1.txt" | cut -c1-300
}
for r in 1 2 3; do
  serve new-all$r /tmp/new all 512 ""
  serve s1-all$r /tmp/s1 all 512 ""
done
for r in 1 2; do
  serve s1-one$r /tmp/s1 gpu 256 ""
  serve new-one$r /tmp/new gpu 256 ""
done
serve new-gil /tmp/new all 512 --gil
serve s1-gil /tmp/s1 all 512 --gil
