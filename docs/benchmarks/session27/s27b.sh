# call 2 of session 27: forward passes replayed (engine/replay.py): natively tested; host per submit; batch 1 and 64 against PyTorch
set -u
say() { echo "=== $*" | tee -a "$OUT/log.txt"; }
summary() { python3 -c "import json, sys; d = json.load(open(sys.argv[1])); [print({k: b.get(k) for k in ('batch', \
 'vggserve_streamed_img_s', 'torch_streamed_img_s', 'ratio_streamed', 'torch_graph_streamed_img_s', \
 'ratio_streamed_over_graph', 'vggserve_kernels_ms')}) for b in d['batches']]" "$1"; }
say tests natively
VGGSERVE_TEST_DEVICE=gpu timeout 120 python3 -m pytest -q -x tests/test_engine_replay.py tests/test_engine_lanes.py 2>&1 | tail -3
say launch_cost fp16,fp8 replay off/on
timeout 150 python3 benchmarks/launch_cost.py --precisions fp16,fp8 --iterations 400 --json "$OUT/launch_cost.json" 2>&1 | grep -v Warning | grep -v lambda | tee -a "$OUT/log.txt"
for p in fp16 fp8 int8 fp16; do say compare $p batch 1 replayed
  timeout 60 python3 benchmarks/compare_torch.py --device gpu --precision fp16 --vggserve-precision $p --batches 1 \
    --iterations 20 --json "$OUT/compare-$p-b1.json" 2>&1 | grep -v Warning >> "$OUT/log.txt"
  summary "$OUT/compare-$p-b1.json"
  if [ $p = fp16 ]; then say compare fp16 batch 1 VGGSERVE_REPLAY=0
    VGGSERVE_REPLAY=0 timeout 60 python3 benchmarks/compare_torch.py --device gpu --precision fp16 --vggserve-precision fp16 --batches 1 \
      --iterations 20 --json "$OUT/compare-fp16-b1-steps.json" 2>&1 | grep -v Warning >> "$OUT/log.txt"
    summary "$OUT/compare-fp16-b1-steps.json"; fi
done
say compare fp16 batch 64 replayed
timeout 80 python3 benchmarks/compare_torch.py --device gpu --precision fp16 --batches 64 --iterations 10 --json "$OUT/compare-fp16-b64.json" 2>&1 | grep -v Warning >> "$OUT/log.txt"
summary "$OUT/compare-fp16-b64.json"
