# call 8 of session 30 (nvidia-h200-x2): one GPU against two, this tree and HEAD (6aa007b), in turn
set -u
mkdir -p /tmp/old && tar -xf .whl/old.tar -C /tmp/old
NEW=$PWD
serve() {  # $1 tag, $2 tree, $3 device, $4 concurrency
  echo "=== $1: service fp16 --decode gpu --device $3, $4 in flight"
  (cd $2 && PYTHONPATH=/tmp/site:$2 timeout 60 python3 benchmarks/serve_saturation.py --weights $VGGSERVE_WEIGHTS \
    --device $3 --decode gpu --precision fp16 --max-batch-size 64 --concurrency $4 --duration 8 --warmup 3 \
    --skip-engine --json "$OUT/serve-$1.json" > "$OUT/serve-$1.txt" 2>&1); echo "rc $?"
  grep -E '^(service)' "$OUT/serve-$1.txt" | cut -c1-110
}
serve new-one $NEW gpu 256
serve new-all $NEW all 512
serve old-one /tmp/old gpu 256
serve old-all /tmp/old all 512
