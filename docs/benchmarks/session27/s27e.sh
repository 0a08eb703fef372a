# call 5 of session 27: replay (now every engine's default) under the engine and whole-network tests natively; the batch job
set -u
say() { echo "=== $*" | tee -a "$OUT/log.txt"; }
say native tests
VGGSERVE_TEST_DEVICE=gpu timeout 330 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py tests/test_engine_replay.py \
  tests/test_engine_lanes.py tests/test_eightbit_engine.py tests/test_engine_raw_images.py tests/test_wgmma_halo.py \
  tests/test_tensorcore.py tests/test_cmdbuf.py -x -rf 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed" | tail -8 | tee -a "$OUT/log.txt"
say batch job fp16 one rank, device decode, 32768 JPEGs
timeout 200 python3 benchmarks/host_vs_engine.py --device gpu --batch-size 64 --precision fp16 --runs batch --batch-decode gpu \
  --images 32768 --json "$OUT/host_vs_engine.json" > "$OUT/host_vs_engine.txt" 2>&1; echo "rc $?"
grep -v Warning "$OUT/host_vs_engine.txt" | tail -12
