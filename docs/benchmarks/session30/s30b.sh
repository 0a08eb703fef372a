# call 2 of session 30: does the driver take a queue priority, and does a high-priority decoder queue let the decode
# run beside the network (in process, the service, the batch job; in turn against the default queue)
set -u
python3 - <<'PY'
import pyopencl as cl
from vggserve.runtime import devices as devs
from vggserve.runtime.queues import prioritised_queue, queue_priority
d = devs.cl_device(devs.resolve("gpu"))
print("extensions:", [e for e in d.extensions.split() if "prior" in e or "throttle" in e])
ctx = cl.Context([d])
for p in ("high", "low", "default"):
    q = prioritised_queue(ctx, d, p)
    print(p, "->", queue_priority(q), list(q.get_info(0x1098)))
PY
for pr in default high; do
  echo "=== in process, decode priority $pr"
  VGGSERVE_DECODE_PRIORITY=$pr timeout 150 python3 benchmarks/device_decode.py --device gpu --images 512 --batch 64 \
    --seconds 3 --no-torch --network fp16 --json "$OUT/orders-$pr.json" 2>&1 | grep -E "network|engine alone"
done
for pr in high default high default; do
  echo "=== service fp16 --decode gpu, 256 in flight, decode priority $pr"
  VGGSERVE_DECODE_PRIORITY=$pr timeout 120 python3 benchmarks/serve_saturation.py --weights $VGGSERVE_WEIGHTS --device gpu \
    --decode gpu --precision fp16 --max-batch-size 64 --concurrency 256 --duration 8 --warmup 3 --engine-seconds 2 \
    --json "$OUT/serve-$pr.json" > "$OUT/serve-$pr.txt" 2>&1; echo "rc $?"
  grep -E '^(service|ratio|engine|cpu)' "$OUT/serve-$pr.txt" | cut -c1-200
done
for pr in high default; do
  echo "=== batch job fp16 --decode gpu, 32768 JPEGs, decode priority $pr"
  VGGSERVE_DECODE_PRIORITY=$pr timeout 120 python3 benchmarks/host_vs_engine.py --device gpu --batch-size 64 --precision fp16 \
    --runs batch --batch-decode gpu --images 32768 --engine-seconds 2 --json "$OUT/batch-$pr.json" > "$OUT/batch-$pr.txt" 2>&1
  echo "rc $?"; grep -v Warning "$OUT/batch-$pr.txt" | tail -6 | cut -c1-220
done
