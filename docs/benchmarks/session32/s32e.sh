# call 5 of session 32 (nvidia-h200-x2): the batch job with the starve rule at five and 13/20 tokens (b758d27): against
# the engine streamed (issue 23), and 1 rank vs 2 in rounds (issue 24), with f733279's batch job in rounds after it
set -u
mkdir -p /tmp/old && tar -xf .whl/old.tar -C /tmp/old
timeout 150 python3 benchmarks/host_vs_engine.py --weights $VGGSERVE_WEIGHTS --device gpu --batch-size 64 \
  --precision fp16 --images 65536 --batch-decode gpu --runs batch --engine-seconds 5 --json $OUT/hve.json \
  > $OUT/hve.txt 2>&1; echo "hve rc $?"; grep -E "^\||engine|decode_groups" $OUT/hve.txt | head -12
timeout 200 python3 benchmarks/scaling.py --gpus 2 --runs batch --precisions fp16 --decode gpu --rounds 3 \
  --batch-size 64 --images 32768 --json $OUT/scaling-new.json > $OUT/scaling-new.txt 2>&1
echo "new rc $?"; grep -E "^scaling|\| |rank 0|rank 1" $OUT/scaling-new.txt | grep -v "^  |---" | head -30
(cd /tmp/old && PYTHONPATH=/tmp/site:/tmp/old timeout 150 python3 benchmarks/scaling.py --gpus 2 --runs batch \
  --precisions fp16 --decode gpu --rounds 2 --batch-size 64 --images 32768 --json $OUT/scaling-old.json \
  > $OUT/scaling-old.txt 2>&1); echo "old rc $?"; grep -E "^scaling|\| " $OUT/scaling-old.txt | grep -v "^  |---" | head -20
