# call 7 of session 34: the final tree against issue 23's targets (batch job, service, the photo mix)
set -u
timeout 400 python3 benchmarks/host_vs_engine.py --weights $VGGSERVE_WEIGHTS --device gpu --batch-size 64 \
  --precision fp16 --images 32768 --batch-decode gpu --runs batch,serve-gpu,photo-gpu --engine-seconds 5 \
  --duration 12 --warmup 3 --json $OUT/hve.json > $OUT/hve.txt 2>&1; echo "hve rc $?"; grep -E "^\||engine" $OUT/hve.txt | head -10
