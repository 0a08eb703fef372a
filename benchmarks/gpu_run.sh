#!/usr/bin/env bash
# GPU measurements in one call. Installs carried wheels (.whl/), registers NVIDIA's OpenCL ICD, then runs the
# stages named in $STAGES (default: all of them, in this order). Every figure is printed and saved under $OUT.
# With arguments, runs them as one command instead of the stages, in the same environment ($VGGSERVE_WEIGHTS: the
# seed-0 weights; $OUT exported), e.g. `bash benchmarks/gpu_run.sh python3 benchmarks/scaling.py --gpus 2`.
#   tests     kernel/engine/CLI tests on the GPU (VGGSERVE_TEST_DEVICE=gpu)
#   tune      vggserve tune at batch 64 and batch 1, for each of $TUNE_PRECISIONS (default fp32) (winners stored,
#             used by the later stages; copied to $OUT/tuned.json)
#   compare   benchmarks/compare_torch.py: vggserve vs PyTorch/cuDNN at the same precision, batches $BATCHES, for each
#             of $PRECISIONS (default fp32: TF32 off)
#   accuracy  benchmarks/precision_accuracy.py: FP16/TF32 against FP32 (both libraries) on 512 natural crops
#   bench     vggserve bench at batch 1 and 64
#   startup   benchmarks/startup.py: process start to first result, warm caches
#   winograd  benchmarks/winograd_vs_gemm.py, if present
#   serve     benchmarks/serve_saturation.py at batch 32 (service images/s vs engine images/s), for each of
#             $HTTP_WORKERS (default "default 1") and $RESIZE_ON (default "device")
#   loadtest  vggserve loadtest (closed and open loop) against vggserve serve on the GPU
#   scaling   benchmarks/batch_scaling.py with 1, 2, 4 ranks (needs a machine with 4 GPUs)
#   multigpu  benchmarks/scaling.py on every GPU of the machine: the batch job (1 rank vs all), the service
#             (--device gpu vs all) and nginx in front of one instance per GPU vs one, FP32 and FP16 (the nginx rows
#             need nginx on the machine); table in the log, JSON in $OUT/scaling_multigpu.json
#   host      benchmarks/host_vs_engine.py at batch 32: the batch job (one rank, $HOST_IMAGES JPEGs) and the service
#             (500x375; the photo mix exact and fast) against the engine's streamed rate, for each of $PRECISIONS
#             (default fp32), and benchmarks/decoders.py (decoders and decode modes on this host's CPU)
#   sparse    benchmarks/sparse_vs_dense.py at each of $SPARSE_BATCHES (default "64 1"): every layer shape at sparsities
#             $SPARSITIES, dense vs the sparse kernels (and cuDNN), the generated kernel up to $CODEGEN_MAX_NNZ
#             non-zeros (default 60000: raise it once the build times it prints allow), the whole network pruned to 90%;
#             curves stored for the engine's kernel choice (copied to $OUT/tuned.json); JSON and PNG in $OUT
#   tcpool    benchmarks/tc_pool.py at batch $POOL_BATCH (default 64), FP16 and TF32: the five conv + pool pairs fused
#             (conv_tc_halo.cl POOL=1) against the convolution plus the pooling kernel, then the whole network both ways;
#             then the same pairs on the halo-tile 2:4 kernel (--sparse24: conv_tc_halo_sparse.cl POOL=1, FP16, every
#             tile that fuses) on 2:4-pruned weights
#   sparse24  benchmarks/mma_sp_probe.py (one mma.sp against numpy: the documented fragment/metadata convention, or
#             which alternative the hardware follows), tests/test_sparse_tc*.py on the GPU, then benchmarks/sparse_tc.py
#             at batch $SPARSE24_BATCH (default 64): every conv shape, dense FP16 vs each tile of both 2:4 kernels
#             (tc_sparse24, tc_halo_sparse24; and cuDNN FP16), each kernel's best tile stored for the engine's choice,
#             the whole network pruned 2:4 vs dense at FP16 (logits, streamed, per-layer device times); JSON in $OUT
#   wgmma     the wgmma engine (issue 25), first run on a GPU: benchmarks/wgmma_ptx.py (driver and patched PTX, build
#             log, into $OUT), tests/test_wgmma.py natively, then benchmarks/wgmma_layers.py at batch 64 and 1 (every
#             layer: each tc_wgmma candidate against today's kernel and cuDNN), VGGSERVE_WGMMA=1 throughout
#   hostfloor the host side alone on this host's cores (no GPU): benchmarks/batch_host_floor.py (one rank with its
#             decode processes; the rank alone with --replay; 15 decode processes and a device at the FP16 and FP32
#             engines' pace, emulated) and benchmarks/serve_host_floor.py (8 front ends on an instant engine)
set -u
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
STAGES=${STAGES:-tests tune compare bench winograd serve loadtest}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
# carried tools that are no wheels (benchmarks/carry_tools.sh copies them there): .whl/bin (py-spy, for
# serve_saturation.py --gil), .whl/nginx (an nginx and the libraries it links, with a wrapper setting
# LD_LIBRARY_PATH, for scaling.py's nginx rows)
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PWD/.whl/bin:$PWD/.whl/nginx:$PATH
mkdir -p /tmp/icd && echo /usr/local/nvidia/lib64/libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd
export OCL_ICD_VENDORS=/tmp/icd VGGSERVE_CACHE_DIR=/tmp/vgcache
LOG="$OUT/log.txt"
say() { echo "=== $*" | tee -a "$LOG"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$LOG"
python3 -m vggserve devices 2>/dev/null | tee -a "$LOG"
W=/tmp/vgg16-seed0.safetensors
python3 -m vggserve weights init --seed 0 --output $W > /dev/null
if [ $# -gt 0 ]; then  # one command instead of the stages
  say "$*"
  export OUT VGGSERVE_WEIGHTS=$W
  "$@" 2>&1 | tee -a "$LOG"
  exit "${PIPESTATUS[0]}"
fi
for stage in $STAGES; do
  say "$stage"
  case $stage in
  tests) VGGSERVE_TEST_DEVICE=gpu timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py \
           tests/test_tensorcore.py tests/test_tc_pool.py tests/test_engine.py tests/test_cli.py tests/test_winograd.py tests/test_resize.py tests/test_engine_raw_images.py \
           tests/test_warmstart.py tests/test_sparse_kernels.py tests/test_pruned_network.py tests/test_sparse_tc.py \
           tests/test_sparse_tc_halo.py -k "not device_specs" -rf 2>&1 \
           | grep -E "^(FAILED|ERROR)|passed|failed" | tail -25 | tee -a "$LOG" ;;
  tune) for p in ${TUNE_PRECISIONS:-fp32}; do for b in 64 1; do
          timeout 300 python3 -m vggserve tune --device gpu --batch-size $b --precision $p --candidates ${CANDIDATES:-40} \
            $([ $p = fp32 ] && echo --winograd) 2>&1 | grep -v Warning | tee -a "$LOG" | tail -13; done; done
        cp /tmp/vgcache/tuned.json "$OUT/tuned.json" ;;
  compare) for p in ${PRECISIONS:-fp32}; do timeout 300 python3 benchmarks/compare_torch.py --device gpu --precision $p \
             --batches ${BATCHES:-1,16,64,256} --iterations 10 --json "$OUT/compare-$p.json" 2>&1 | grep -v Warning \
             | tee -a "$LOG"; done ;;
  accuracy) timeout 400 python3 benchmarks/precision_accuracy.py --device gpu --images ${ACCURACY_IMAGES:-512} \
              --json "$OUT/accuracy.json" 2>&1 | grep -v Warning | tee -a "$LOG" ;;
  bench) for b in 1 64; do timeout 120 python3 -m vggserve bench --device gpu --batch-size $b --iterations 10 2>&1 \
           | grep -v Warning | tee -a "$LOG" | tail -3; done ;;
  startup) timeout 200 python3 benchmarks/startup.py --weights $W --device gpu --runs 5 --json "$OUT/startup.json" 2>&1 \
             | grep -v Warning | tee -a "$LOG"
           python3 -X importtime -c "import vggserve.model.vgg16" 2>&1 | sort -t'|' -k2 -n | tail -6 | tee -a "$LOG" ;;
  winograd) [ -f benchmarks/winograd_vs_gemm.py ] && for b in 64 1; do timeout 200 python3 benchmarks/winograd_vs_gemm.py \
              --device gpu --batch $b 2>&1 | grep -v Warning | tee -a "$LOG"; done ;;
  serve) n=0; for hw in ${HTTP_WORKERS:-default 1}; do for where in ${RESIZE_ON:-device}; do
           n=$((n + 1)); flag=$([ "$hw" = default ] || echo "--http-workers $hw")
           say "serve run $n, http workers: $hw, resize on: $where"
           timeout 240 python3 benchmarks/serve_saturation.py --weights $W --device gpu --max-batch-size 32 --duration 25 \
             --warmup 5 --engine-seconds 8 --resize-on $where $flag --json "$OUT/serve-$n-$hw-$where.json" 2>&1 \
             | grep -v Warning | tail -25 | tee -a "$LOG"
         done; done ;;
  loadtest) python3 -m vggserve serve --weights $W --device gpu --max-batch-size 32 --port 8411 > /tmp/serve.log 2>&1 &
            mkdir -p /tmp/lt-images && python3 - <<'PY'
from PIL import Image
import numpy as np
rng = np.random.default_rng(0)
for i, (w, h) in enumerate([(500, 375), (640, 480), (1024, 768), (300, 300), (800, 600), (375, 500)]):
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(f"/tmp/lt-images/img{i}.jpg", quality=90)
PY
            timeout 200 python3 -m vggserve loadtest --url http://127.0.0.1:8411 --images /tmp/lt-images --mode closed \
              --concurrency 1,8,32,128 --duration 10 --warmup 3 --wait-ready 120 --output /tmp/lt-closed --quiet 2>&1 | tail -12 | tee -a "$LOG"
            timeout 200 python3 -m vggserve loadtest --url http://127.0.0.1:8411 --images /tmp/lt-images --mode open \
              --rate 100,200,400 --duration 10 --warmup 3 --output /tmp/lt-open --quiet 2>&1 | tail -12 | tee -a "$LOG"
            kill %1 2>/dev/null
            cp /tmp/lt-closed/throughput.png "$OUT/lt_closed_throughput.png" 2>/dev/null
            cp /tmp/lt-closed/latency.png "$OUT/lt_closed_latency.png" 2>/dev/null
            (cd /tmp && tar czf "$OUT/loadtest.tgz" lt-closed lt-open) ;;
  sparse24) timeout 60 python3 benchmarks/mma_sp_probe.py --device gpu --json "$OUT/mma_sp_probe.json" 2>&1 \
              | grep -v Warning | tee -a "$LOG" | tail -4
            VGGSERVE_TEST_DEVICE=gpu timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_sparse_tc.py \
              tests/test_sparse_tc_halo.py tests/test_sparse_tc_pool.py 2>&1 \
              | tail -3 | tee -a "$LOG"
            timeout ${SPARSE24_TIMEOUT:-300} python3 benchmarks/sparse_tc.py --device gpu --batch ${SPARSE24_BATCH:-64} \
              --network-batches ${SPARSE24_BATCH:-64} --store --json "$OUT/sparse24.json" 2>&1 | grep -v Warning \
              | tee -a "$LOG"
            cp /tmp/vgcache/tuned.json "$OUT/tuned.json" ;;
  sparse) for b in ${SPARSE_BATCHES:-64 1}; do timeout ${SPARSE_TIMEOUT:-560} python3 benchmarks/sparse_vs_dense.py \
            --device gpu --batch $b --sparsities ${SPARSITIES:-0,0.5,0.7,0.8,0.9,0.95,0.99} \
            --codegen-max-nnz ${CODEGEN_MAX_NNZ:-60000} --network-batches $b --store --json "$OUT/sparse$b.json" \
            --png "$OUT/sparse$b.png" 2>&1 | grep -v Warning | tee -a "$LOG"; done
          cp /tmp/vgcache/tuned.json "$OUT/tuned.json" ;;
  scaling) timeout 500 python3 benchmarks/batch_scaling.py --weights $W --images ${SCALING_IMAGES:-1024} --ranks 1,2,4 \
             --batch-size 32 --json "$OUT/scaling.json" 2>&1 | tail -12 | tee -a "$LOG" ;;
  multigpu) timeout 590 python3 benchmarks/scaling.py --weights $W --images ${MULTIGPU_IMAGES:-4096} \
              --duration ${MULTIGPU_DURATION:-15} --json "$OUT/scaling_multigpu.json" 2>&1 | grep -v Warning \
              | tail -15 | tee -a "$LOG" ;;
  host) for p in ${PRECISIONS:-fp32}; do timeout 580 python3 benchmarks/host_vs_engine.py --weights $W --device gpu \
          --batch-size 32 --precision $p --images ${HOST_IMAGES:-8192} --duration 20 --warmup 4 --engine-seconds 6 \
          --workdir /tmp/host --json "$OUT/host-$p.json" 2>&1 | grep -v Warning | tail -9 | tee -a "$LOG"; done
        timeout 300 python3 benchmarks/decoders.py --workdir /tmp/decoders --json "$OUT/decoders.json" 2>&1 \
          | tail -40 | tee -a "$LOG" ;;
  tcpool) timeout 300 python3 benchmarks/tc_pool.py --device gpu --batch ${POOL_BATCH:-64} --precisions fp16,tf32 \
            --network --json "$OUT/tc_pool.json" 2>&1 | grep -v Warning | tee -a "$LOG"
          timeout 200 python3 benchmarks/tc_pool.py --device gpu --batch ${POOL_BATCH:-64} --precisions fp16 \
            --sparse24 --tiles all --json "$OUT/tc_pool_sparse24.json" 2>&1 | grep -v Warning | tee -a "$LOG" ;;
  wgmma) export VGGSERVE_WGMMA=1
         timeout 120 python3 benchmarks/wgmma_ptx.py --device gpu --out "$OUT" 2>&1 | grep -v Warning | tee -a "$LOG"
         VGGSERVE_TEST_DEVICE=gpu timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_wgmma.py -x -rf 2>&1 \
           | grep -E "^(FAILED|ERROR)|passed|failed|Error" | tail -15 | tee -a "$LOG"
         for b in ${WGMMA_BATCHES:-64 1}; do timeout 400 python3 benchmarks/wgmma_layers.py --device gpu --batch $b \
           --precisions ${WGMMA_PRECISIONS:-fp16,tf32} --json "$OUT/wgmma_layers_$b.json" 2>&1 | grep -v Warning \
           | tee -a "$LOG"; done ;;
  hostfloor) for args in "--images 4096 --workdir /tmp/floor" \
                         "--images 256 --repeat 32 --decode-procs 1 --replay --workdir /tmp/floor256" \
                         "--images 256 --repeat 16 --replay --replay-ms 2.2 --device-ms 6.5 --workdir /tmp/floor256" \
                         "--images 256 --repeat 16 --replay --replay-ms 2.2 --device-ms 12.7 --workdir /tmp/floor256"; do
               timeout 200 python3 benchmarks/batch_host_floor.py --batch-size 32 $args 2>&1 | tail -4 | tee -a "$LOG"
             done
             timeout 200 python3 benchmarks/serve_host_floor.py --http-workers 8 --client-procs 4 --concurrency 128 \
               --duration 15 --json "$OUT/serve-floor.json" 2>&1 | tail -3 | tee -a "$LOG" ;;
  esac
done
