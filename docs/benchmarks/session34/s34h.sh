# call 8 of session 34: the review's final tree, native tests of the decoder's kernels (jpeg_idct, jpeg_color,
# jpeg_entropy, jpeg_huffman), the resize and what uses them
set -u
VGGSERVE_TEST_DEVICE=gpu timeout 400 python3 -m pytest -q tests/test_resize.py tests/test_device_jpeg.py \
  tests/test_decode_groups.py tests/test_serving_device_decode.py tests/test_engine_raw_images.py 2>&1 | tail -4
timeout 120 python3 benchmarks/device_decode.py --device gpu --images 512 --batch 64 --seconds 2 --no-torch --group 4 \
  2>&1 | grep -E "identical|device ms per batch of 64 \("
