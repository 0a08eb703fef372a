# call 1 of session 32 (nvidia-h200-x2): the synchronisation rounds looped in one launch (jpeg_sync_loop) -- native
# tests, then the decoder's device time and decode + FP16 network in process, loop (LOOP_FROM 1, 0) against a launch
# per round (--loop-from 99), in turn
set -u
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
VGGSERVE_TEST_DEVICE=gpu timeout 150 python3 -m pytest -q -x tests/test_device_jpeg.py -k "not cjpeg" \
  > $OUT/tests.txt 2>&1; echo "tests rc $?"; tail -3 $OUT/tests.txt
dd() {  # $1 tag, rest: device_decode args
  tag=$1; shift
  echo "=== $tag: $*"
  timeout 120 python3 benchmarks/device_decode.py --device gpu --images 512 --batch 64 --no-torch "$@" \
    --json $OUT/dd-$tag.json > $OUT/dd-$tag.txt 2>&1; echo "rc $?"
  grep -E "^(device ms per batch of 64 \(|sync rounds|device decode|engine|decode \+|serial|early|ahead)" $OUT/dd-$tag.txt | cut -c1-230
}
dd net-loop1 --seconds 2 --network fp16 --loop-from 1
dd net-perround --seconds 2 --network fp16 --loop-from 99
dd net-loop0 --seconds 2 --network fp16 --loop-from 0
dd g4-loop1 --seconds 1 --group 4 --loop-from 1
dd g4-perround --seconds 1 --group 4 --loop-from 99
dd mix-loop1 --seconds 1 --mix photo --loop-from 1
dd mix-perround --seconds 1 --mix photo --loop-from 99
