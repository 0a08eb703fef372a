# call 5 of session 30 (nvidia-h200-x2): the host's CPUs; issue 24's FP32 rows; nginx at FP16 with 16 load processes
set -u
export PATH=$PWD/.whl/nginx:$PATH
lscpu | grep -E "^(Model name|Socket|Core|Thread|CPU\(s\)|NUMA node)" ; nproc
echo "=== scaling fp32"
timeout 330 python3 benchmarks/scaling.py --gpus 2 --runs service,nginx,batch --precisions fp32 --decode gpu \
  --batch-size 64 --duration 8 --warmup 3 --images 16384 --workdir /tmp/sc --json "$OUT/scaling-fp32.json" \
  > "$OUT/scaling-fp32.txt" 2>&1; echo "rc $?"
grep -v Warning "$OUT/scaling-fp32.txt" | grep -E "^\||^scaling|Scaling" | tail -12 | cut -c1-220
echo "=== nginx fp16, 16 load processes"
timeout 150 python3 benchmarks/scaling.py --gpus 2 --runs nginx --precisions fp16 --decode gpu --client-procs 16 \
  --batch-size 64 --duration 8 --warmup 3 --workdir /tmp/sc --json "$OUT/scaling-nginx16.json" \
  > "$OUT/scaling-nginx16.txt" 2>&1; echo "rc $?"
grep -v Warning "$OUT/scaling-nginx16.txt" | grep -E "^\||^scaling|Scaling" | tail -6 | cut -c1-220
