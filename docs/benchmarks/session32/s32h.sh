# call 8 of session 32 (nvidia-h200-x2): the two-GPU FP16 service with 8, 10, 12 (auto's default) and 16 front ends,
# in turn, 512 requests in flight, --decode gpu
set -u
s() {  # $1 tag, $2 http workers
  timeout 60 python3 benchmarks/serve_saturation.py --weights $VGGSERVE_WEIGHTS --device all --decode gpu \
    --precision fp16 --max-batch-size 64 --concurrency 512 --duration 8 --warmup 3 --skip-engine --http-workers $2 \
    --json $OUT/serve-$1.json > $OUT/serve-$1.txt 2>&1; echo "$1 (--http-workers $2) rc $?: $(grep -E '^service' $OUT/serve-$1.txt | head -1 | cut -c1-200)"
}
s a12 12
s a8 8
s a10 10
s a16 16
s b8 8
s b12 12
s b10 10
