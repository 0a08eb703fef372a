# call 1 of session 27: command buffers on NVIDIA's driver?; batch-1 host cost per submit; FP8's last per-tap layer; FP8 agreement
set -u
say() { echo "=== $*" | tee -a "$OUT/log.txt"; }
say command_buffer_probe
timeout 60 python3 benchmarks/command_buffer_probe.py --device gpu --json "$OUT/cmdbuf.json" 2>&1 | grep -v Warning | tee -a "$OUT/log.txt"
python3 -c "import json; print(json.load(open('$OUT/cmdbuf.json')))" 2>&1 | tail -2
say launch_cost fp16,fp8
timeout 120 python3 benchmarks/launch_cost.py --precisions fp16,fp8 --iterations 400 --json "$OUT/launch_cost.json" 2>&1 | grep -v Warning | tee -a "$OUT/log.txt"
say tune fp8 batch 64 512x512x14+pool
timeout 150 python3 -m vggserve tune --device gpu --batch-size 64 --precision fp8 --algos wgmma_halo --candidates 12 \
  --repeats 5 --shapes 512x512x14+pool 2>&1 | grep -v Warning | tee -a "$OUT/log.txt" | grep -E "best|failed|agreed|rror|stored"
cp /tmp/vgcache/tuned.json "$OUT/tuned.json"
say precision_accuracy fp32,fp8
timeout 200 python3 benchmarks/precision_accuracy.py --device gpu --images 512 --calibration-images 64 --precisions fp32,fp8 \
  --methods max --no-torch --json "$OUT/accuracy-fp8.json" 2>&1 | grep -v Warning | tee -a "$OUT/log.txt" | tail -15
