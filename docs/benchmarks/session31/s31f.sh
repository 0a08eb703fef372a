# call 6 of session 31 (nvidia-h200-x2): issue 24's FP16 service and batch rows, three and two rounds in turn (scaling.py --rounds)
set -u
timeout 200 python3 benchmarks/scaling.py --gpus 2 --runs service --precisions fp16 --decode gpu --rounds 3 \
  --batch-size 64 --duration 8 --warmup 3 --json $OUT/scaling-service.json > $OUT/scaling-service.txt 2>&1
echo "rc $?"; grep -E "^scaling|\| " $OUT/scaling-service.txt | head
timeout 130 python3 benchmarks/scaling.py --gpus 2 --runs batch --precisions fp16 --decode gpu --rounds 2 \
  --batch-size 64 --images 32768 --json $OUT/scaling-batch.json > $OUT/scaling-batch.txt 2>&1
echo "rc $?"; grep -E "^scaling|\| " $OUT/scaling-batch.txt | head -20
