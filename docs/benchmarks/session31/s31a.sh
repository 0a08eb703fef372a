# call 1 of session 31 (nvidia-h200-x2): early take after every device-decoded batch (this tree) against HEAD~1 (92a1403), in turn
set -u
mkdir -p /tmp/old && tar -xf .whl/old.tar -C /tmp/old
NEW=$PWD
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
serve() {  # $1 tag, $2 tree, $3 device, $4 concurrency
  echo "=== $1: service fp16 --decode gpu --device $3, $4 in flight"
  (cd $2 && PYTHONPATH=/tmp/site:$2 timeout 70 python3 benchmarks/serve_saturation.py --weights $VGGSERVE_WEIGHTS \
    --device $3 --decode gpu --precision fp16 --max-batch-size 64 --concurrency $4 --duration 8 --warmup 3 \
    --skip-engine --json "$OUT/serve-$1.json" > "$OUT/serve-$1.txt" 2>&1); echo "rc $?"
  grep -E '^(service|cpu)' "$OUT/serve-$1.txt"
}
serve new-one1 $NEW gpu 256
serve old-one1 /tmp/old gpu 256
serve new-all1 $NEW all 512
serve old-all1 /tmp/old all 512
serve old-one2 /tmp/old gpu 256
serve new-one2 $NEW gpu 256
serve old-all2 /tmp/old all 512
serve new-all2 $NEW all 512
