# call 4 of session 31 (nvidia-h200-x2): the host's per-core speed under load; issue 24's FP16 table with this tree
set -u
echo "=== topology"; nproc; lscpu | grep -iE "model name|thread|core|socket|numa|mhz|hypervisor"
cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list /sys/devices/system/cpu/cpu0/topology/core_siblings_list 2>&1
echo "=== cpu contention"
timeout 120 python3 docs/benchmarks/session31/cpu_contention.py 0 4 8 12 16 20 24 28 31
echo "=== scaling fp16"
timeout 420 python3 benchmarks/scaling.py --gpus 2 --runs service,nginx,batch --precisions fp16 --decode gpu \
  --batch-size 64 --duration 8 --warmup 3 --images 32768 --json $OUT/scaling-fp16.json > $OUT/scaling-fp16.txt 2>&1
echo "rc $?"; grep -E "^scaling|ratio|\| " $OUT/scaling-fp16.txt | head -30
