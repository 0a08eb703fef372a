# call 4 of session 34: which native resize test failed in call 3, and the resize kernels alone, local against global
set -u
VGGSERVE_TEST_DEVICE=gpu timeout 150 python3 -m pytest -q -x tests/test_resize.py --tb=short 2>&1 | tail -30
timeout 100 python3 .whl/rsz.py gpu 2>&1 | tail -3
