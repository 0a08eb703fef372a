# call 3 of session 30 (nvidia-h200-x2): why does each of two engine processes serve less than one alone?
# GIL of both engine processes (py-spy), device busy, at 512 and 1024 in flight; one GPU at 512 for the same depth
set -u
SPY=$PWD/.whl/bin/py-spy
spy() {  # $1: tag. samples engine 0 (the serve process) and engine 1 (engine_process) under load
  for i in $(seq 1 400); do p=$(pgrep -f "m vggserve serve" | head -1); [ -n "$p" ] && break; sleep 0.5; done
  sleep ${SPY_WAIT:-14}
  for p in $(pgrep -f "m vggserve serve" | head -1) $(pgrep -f "processes.engine_process" | head -1); do
    timeout 20 $SPY record -p "$p" -d 3 -r 250 --nonblocking --gil -f raw -o "$OUT/spy-$1-$p-gil.txt" > /dev/null 2>&1 &
  done; wait
  for p in $(pgrep -f "m vggserve serve" | head -1) $(pgrep -f "processes.engine_process" | head -1); do
    timeout 20 $SPY record -p "$p" -d 3 -r 250 --nonblocking -f raw -o "$OUT/spy-$1-$p-all.txt" > /dev/null 2>&1 &
  done; wait
}
run() {  # $1 tag, $2 device, $3 concurrency
  echo "=== service fp16 --decode gpu --device $2, $3 in flight"
  spy $1 &
  timeout 120 python3 benchmarks/serve_saturation.py --weights $VGGSERVE_WEIGHTS --device $2 --decode gpu --precision fp16 \
    --max-batch-size 64 --concurrency $3 --duration 10 --warmup 3 --skip-engine --json "$OUT/serve-$1.json" \
    > "$OUT/serve-$1.txt" 2>&1; echo "rc $?"; wait
  grep -E '^(service|ratio|cpu|threads)' "$OUT/serve-$1.txt" | cut -c1-300
  for f in "$OUT"/spy-$1-*-gil.txt; do echo "$f GIL samples $(awk '{s+=$NF} END {print s}' $f) of 750"; done
}
run all512 all 512
run all1024 all 1024
run one512 gpu 512
