# call 5 of session 31 (nvidia-h200-x2): the engine's answers through DirectLink (this tree) against 492380f, in turn; then issue 24's FP16 table with this tree
set -u
mkdir -p /tmp/s1 && tar -xf .whl/s1.tar -C /tmp/s1
NEW=$PWD
serve() {  # $1 tag, $2 tree, $3 device, $4 concurrency
  echo "=== $1: service fp16 --decode gpu --device $3, $4 in flight"
  (cd $2 && PYTHONPATH=/tmp/site:$2 timeout 80 python3 benchmarks/serve_saturation.py --weights $VGGSERVE_WEIGHTS \
    --device $3 --decode gpu --precision fp16 --max-batch-size 64 --concurrency $4 --duration 8 --warmup 3 \
    --skip-engine --json "$OUT/serve-$1.json" > "$OUT/serve-$1.txt" 2>&1); echo "rc $?"
  grep -E '^(service|cpu|threads)' "$OUT/serve-$1.txt" | cut -c1-300
}
serve new-all1 $NEW all 512
serve old-all1 /tmp/s1 all 512
serve old-all2 /tmp/s1 all 512
serve new-all2 $NEW all 512
serve new-one1 $NEW gpu 256
serve old-one1 /tmp/s1 gpu 256
echo "=== scaling fp16"
timeout 300 python3 benchmarks/scaling.py --gpus 2 --runs service,nginx,batch --precisions fp16 --decode gpu \
  --batch-size 64 --duration 8 --warmup 3 --images 32768 --json $OUT/scaling-fp16.json > $OUT/scaling-fp16.txt 2>&1
echo "rc $?"; grep -E "^scaling|\| " $OUT/scaling-fp16.txt | head -30
