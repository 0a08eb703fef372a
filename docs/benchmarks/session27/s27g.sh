# call 7 of session 27: why test_a_tuned_entry_for_the_other_kernel_family_falls_back_to_the_default fails natively (replay on and off)
set -u
for r in 1 0; do echo "=== VGGSERVE_REPLAY=$r"
VGGSERVE_REPLAY=$r VGGSERVE_TEST_DEVICE=gpu timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_engine.py \
  -k test_a_tuned_entry_for_the_other_kernel_family 2>&1 | grep -E "^E |assert|passed|failed" | head -12
done
python3 -c "
from vggserve import VGG16
from vggserve.weights.init import init_weights
import sys; sys.path.insert(0, 'tests')
from conftest import TINY_WIDTH
m = VGG16(init_weights(seed=0, width=TINY_WIDTH), device='gpu', max_batch_size=1, precision='fp16')
for p in m.kernel_plan(): print(p)
" 2>&1 | grep -v Warn | head -30
