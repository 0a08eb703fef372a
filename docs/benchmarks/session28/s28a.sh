# call 1 of session 28: the replay mends natively; the decoder with the network at groups 1 and 4 (H200)
set -u
say() { echo "=== $*" | tee -a "$OUT/log.txt"; }
say native tests
VGGSERVE_TEST_DEVICE=gpu timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py tests/test_engine_replay.py \
  tests/test_engine_lanes.py tests/test_cmdbuf.py -k "not device_specs" -rf 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed" | tail -8 | tee -a "$OUT/log.txt"
for g in 1 4; do
  say device_decode group $g network fp16
  timeout 150 python3 benchmarks/device_decode.py --device gpu --images 512 --batch 64 --seconds 2 --no-torch --network fp16 --group $g --json "$OUT/decode-g$g.json" 2>&1 | grep -v Warning | tee -a "$OUT/log.txt"
done
