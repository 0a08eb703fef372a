#!/usr/bin/env bash
# What holds the FP16 service on several GPUs: benchmarks/scaling.py's service run (--device gpu, then --device all)
# with nvidia-smi every second (utilisation, SM clock, power, throttle reasons: benchmarks/smi_summary.py averages
# them per GPU and phase) and py-spy --gil on the engine processes (the share of samples holding the GIL).
#   bash benchmarks/gpu_run.sh bash benchmarks/service_gpu_idle.sh      (py-spy on PATH: gpu_run.sh's .whl wheels)
# Writes under $OUT: scaling.txt, smi.csv, host.txt (time, CPU MHz, child engines, load), profiles.tgz.
GPUS=${GPUS:-4}
nproc; nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
lscpu | grep -E "Model name|Socket|NUMA node|MHz"
nvidia-smi --query-gpu=timestamp,index,utilization.gpu,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader -lms 1000 > $OUT/smi.csv 2>&1 &
SMI=$!
(while true; do echo "$(date +%s) $(awk '/MHz/ {s+=$4; n++} END {printf "%.0f", s/n}' /proc/cpuinfo) $(pgrep -fc 'engine_process import main') $(cut -d' ' -f1 /proc/loadavg)"; sleep 1; done > $OUT/host.txt) &
MON=$!
(timeout 330 python3 benchmarks/scaling.py --gpus $GPUS --runs service --precisions fp16 --decode gpu --batch-size 64 --duration 20 --warmup 4 --client-procs 16 --json $OUT/scaling.json > $OUT/scaling.txt 2>&1; echo done >> $OUT/scaling.txt) &
# profile the engines once loaded: the one-GPU service's engine is the `vggserve serve` process itself; the four-GPU
# one has it (engine 0) and three child engine processes
for phase in 1 $GPUS; do
  if [ $phase = 1 ]; then
    for i in $(seq 200); do pgrep -f 'vggserve serve' > /dev/null && break; sleep 1; done
  else
    for i in $(seq 300); do [ "$(pgrep -fc 'engine_process import main')" = $((GPUS - 1)) ] && break; sleep 1; done
  fi
  sleep 16
  for P in $(pgrep -f 'vggserve serve' | head -1) $(pgrep -f 'engine_process import main' | head -1); do
    py-spy record -p $P -d 8 -r 100 --nonblocking --gil --threads --format raw -o $OUT/gil_${phase}_$P.raw > /dev/null 2>&1 &
    py-spy record -p $P -d 8 -r 100 --nonblocking --idle --threads --format raw -o $OUT/all_${phase}_$P.raw > /dev/null 2>&1 &
  done
  echo "phase $phase at $(date +%s)"; ps -eo pid,pcpu,args --sort=-pcpu | head -14 | cut -c1-150
  sleep 10
  if [ $phase = 1 ]; then while pgrep -f 'vggserve serve' > /dev/null; do sleep 1; done; fi
done
for i in $(seq 200); do grep -q "^done" $OUT/scaling.txt && break; sleep 1; done
kill $SMI $MON
grep -vE "^\s*$" $OUT/scaling.txt | tail -12
python3 benchmarks/smi_summary.py $OUT/smi.csv $OUT/host.txt
rm -f $OUT/scaling.json
for f in $OUT/gil_*.raw; do echo "$(basename $f): $(awk '{n+=$NF} END {print n}' $f) GIL-held samples of 800 (8 s at 100 Hz)"; done
tar -czf $OUT/profiles.tgz -C $OUT $(cd $OUT && ls *.raw) && rm -f $OUT/*.raw
