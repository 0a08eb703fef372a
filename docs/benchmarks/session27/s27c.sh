# call 3 of session 27: replayed forward passes: lanes at batch 1, FP8 b64/256 with the new table entry, TF32 batch 1, the service at 1 in flight and under load
set -u
say() { echo "=== $*" | tee -a "$OUT/log.txt"; }
summary() { python3 -c "import json, sys; d = json.load(open(sys.argv[1])); [print({k: b.get(k) for k in ('batch', \
 'vggserve_streamed_img_s', 'torch_streamed_img_s', 'ratio_streamed', 'torch_graph_streamed_img_s', \
 'ratio_streamed_over_graph', 'vggserve_kernels_ms')}) for b in d['batches']]" "$1"; }
say lanes fp16,fp8 batch 1
timeout 150 python3 benchmarks/lanes.py --precisions fp16,fp8 --batches 1 --lanes 1,2 --iterations 400 --rounds 3 \
  --json "$OUT/lanes.json" 2>&1 | grep -v Warning | grep -v lambda | tee -a "$OUT/log.txt" | tail -12
say compare fp8 batch 64,256
timeout 90 python3 benchmarks/compare_torch.py --device gpu --precision fp16 --vggserve-precision fp8 --batches 64,256 \
  --iterations 10 --json "$OUT/compare-fp8-b64.json" 2>&1 | grep -v Warning >> "$OUT/log.txt"
summary "$OUT/compare-fp8-b64.json"
say compare tf32 batch 1
timeout 60 python3 benchmarks/compare_torch.py --device gpu --precision tf32 --batches 1 \
  --iterations 20 --json "$OUT/compare-tf32-b1.json" 2>&1 | grep -v Warning >> "$OUT/log.txt"
summary "$OUT/compare-tf32-b1.json"
for r in 1 0; do say service fp16 decode gpu, 1 in flight, VGGSERVE_REPLAY=$r
  VGGSERVE_REPLAY=$r timeout 75 python3 benchmarks/serve_saturation.py --weights $VGGSERVE_WEIGHTS --device gpu --decode gpu \
    --precision fp16 --max-batch-size 64 --concurrency 1 --client-procs 1 --duration 8 --warmup 3 --engine-seconds 4 \
    --json "$OUT/serve-c1-replay$r.json" 2>&1 | grep -v Warning | grep -E '^(engine|service|cpu|ratio|latency)' | tee -a "$OUT/log.txt"
done
say service fp16 decode gpu, 256 in flight
timeout 90 python3 benchmarks/serve_saturation.py --weights $VGGSERVE_WEIGHTS --device gpu --decode gpu \
  --precision fp16 --max-batch-size 64 --concurrency 256 --duration 10 --warmup 4 --engine-seconds 5 \
  --json "$OUT/serve-c256.json" 2>&1 | grep -v Warning | grep -E '^(engine|service|cpu|ratio|latency)' | tee -a "$OUT/log.txt"
