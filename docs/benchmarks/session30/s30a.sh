# call 1 of session 30 (nvidia-h200-x2): issue 23's question (is the device busy under the service?) and issue 24's
# FP16 rows (service, nginx, batch job; one GPU against two)
set -u
export PATH=$PWD/.whl/nginx:$PATH
echo "=== nproc $(nproc)"; nvidia-smi -L; nginx -v 2>&1
SPY=$PWD/.whl/bin/py-spy
(  # sample the engine process (the `vggserve serve` process itself) under load: GIL held, and every thread
  for i in $(seq 1 400); do p=$(pgrep -f "m vggserve serve" | head -1); [ -n "$p" ] && break; sleep 0.5; done
  sleep 13; p=$(pgrep -f "m vggserve serve" | head -1); echo "spy pid $p: $(tr '\0' ' ' < /proc/$p/cmdline | cut -c1-120)" > "$OUT/spy.txt"
  timeout 20 $SPY record -p "$p" -d 3 -r 250 --nonblocking --gil -f raw -o "$OUT/spy-gil.txt" >> "$OUT/spy.txt" 2>&1
  timeout 20 $SPY record -p "$p" -d 3 -r 250 --nonblocking --threads -f raw -o "$OUT/spy-all.txt" >> "$OUT/spy.txt" 2>&1
) &
echo "=== service fp16 --decode gpu, one GPU, 256 in flight"
timeout 150 python3 benchmarks/serve_saturation.py --weights $VGGSERVE_WEIGHTS --device gpu --decode gpu --precision fp16 \
  --max-batch-size 64 --concurrency 256 --duration 8 --warmup 3 --engine-seconds 3 --json "$OUT/serve-gpu.json" \
  > "$OUT/serve-gpu.txt" 2>&1; echo "rc $?"
grep -v Warning "$OUT/serve-gpu.txt" | tail -32 | cut -c1-220
wait; cat "$OUT/spy.txt" | tail -5
echo "=== scaling fp16"
timeout 380 python3 benchmarks/scaling.py --gpus 2 --runs service,nginx,batch --precisions fp16 --decode gpu \
  --batch-size 64 --duration 8 --warmup 3 --images 32768 --workdir /tmp/sc --json "$OUT/scaling-fp16.json" \
  > "$OUT/scaling-fp16.txt" 2>&1; echo "rc $?"
grep -v Warning "$OUT/scaling-fp16.txt" | grep -E "^\||^scaling|Scaling|rank|^  " | tail -40 | cut -c1-220
