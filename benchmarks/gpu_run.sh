#!/usr/bin/env bash
# One GPU session: install carried wheels, register NVIDIA's OpenCL ICD, check correctness on the GPU, then
# measure vggserve beside PyTorch/cuDNN, tune, and measure again. Writes figures under $OUT (default ./gpu-out).
set -u
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/icd && echo /usr/local/nvidia/lib64/libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd
export OCL_ICD_VENDORS=/tmp/icd VGGSERVE_CACHE_DIR=/tmp/vgcache
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m vggserve devices | tee -a "$OUT/gpu.txt"
step() { echo "=== $*"; }
step tests on the GPU
VGGSERVE_TEST_DEVICE=gpu timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_engine.py \
  -k "not device_specs" 2>&1 | tail -4 | tee "$OUT/tests.txt"
step bench default parameters
timeout 120 python3 -m vggserve bench --device gpu --batch-size 1 --iterations 20 | tee "$OUT/bench1.txt" | tail -3
timeout 120 python3 -m vggserve bench --device gpu --batch-size 64 --iterations 10 | tee "$OUT/bench64.txt" | tail -3
step compare with torch, default parameters
timeout 300 python3 benchmarks/compare_torch.py --device gpu --batches ${BATCHES:-1,16,64,256} --iterations 10 \
  --json "$OUT/compare_default.json" 2>&1 | tee "$OUT/compare_default.txt"
if [ "${TUNE:-1}" = 1 ]; then
  step tune
  timeout 400 python3 -m vggserve tune --device gpu --batch-size 64 --candidates ${CANDIDATES:-40} --json > "$OUT/tune64.json" 2> "$OUT/tune64.txt"
  tail -14 "$OUT/tune64.txt"; cp /tmp/vgcache/tuned.json "$OUT/" 2>/dev/null
  step compare with torch, tuned
  timeout 300 python3 benchmarks/compare_torch.py --device gpu --batches ${BATCHES:-1,16,64,256} --iterations 10 \
    --json "$OUT/compare_tuned.json" 2>&1 | tee "$OUT/compare_tuned.txt"
  timeout 120 python3 -m vggserve bench --device gpu --batch-size 64 --iterations 10 | tee "$OUT/bench64_tuned.txt" | tail -3
fi
