# call 6 of session 27: the native tests again, without the device-spec test that gpu_run.sh's tests stage leaves out
set -u
say() { echo "=== $*" | tee -a "$OUT/log.txt"; }
say native tests
VGGSERVE_TEST_DEVICE=gpu timeout 400 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py tests/test_engine_replay.py \
  tests/test_engine_lanes.py tests/test_eightbit_engine.py tests/test_engine_raw_images.py tests/test_wgmma_halo.py \
  tests/test_tensorcore.py tests/test_cmdbuf.py -k "not device_specs" -rf 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed" | tail -8 | tee -a "$OUT/log.txt"
