# call 6 of session 34: the final tree's native tests of the device decoder, the resize and what uses them
set -u
VGGSERVE_TEST_DEVICE=gpu timeout 500 python3 -m pytest -q tests/test_resize.py tests/test_device_jpeg.py \
  tests/test_decode_groups.py tests/test_serving_device_decode.py tests/test_engine_raw_images.py 2>&1 | tail -6
