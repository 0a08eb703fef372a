# call 10 of session 27: recordings' kernels made through ctypes: native tests, a recording's cost, batch 1 again
set -u
say() { echo "=== $*" | tee -a "$OUT/log.txt"; }
say native tests
VGGSERVE_TEST_DEVICE=gpu timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py tests/test_engine_replay.py \
  tests/test_engine_lanes.py tests/test_eightbit_engine.py tests/test_engine_raw_images.py tests/test_wgmma_halo.py \
  tests/test_tensorcore.py tests/test_cmdbuf.py -k "not device_specs" -rf 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed" | tail -8 | tee -a "$OUT/log.txt"
say launch_cost fp16,fp8
timeout 100 python3 benchmarks/launch_cost.py --precisions fp16,fp8 --iterations 300 --json "$OUT/launch_cost.json" 2>&1 | grep -v Warning | grep -v lambda | grep replayed
say compare fp16 batch 1
timeout 60 python3 benchmarks/compare_torch.py --device gpu --precision fp16 --batches 1 --iterations 20 --json "$OUT/compare-fp16-b1.json" 2>&1 | grep -v Warning >> "$OUT/log.txt"
python3 -c "import json; b = json.load(open('$OUT/compare-fp16-b1.json'))['batches'][0]; print({k: b[k] for k in ('vggserve_streamed_img_s', 'torch_graph_streamed_img_s', 'ratio_streamed_over_graph', 'vggserve_kernels_ms')})"
