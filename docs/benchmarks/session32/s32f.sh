# call 6 of session 32 (nvidia-h200-x2): waits that sleep between status checks (this tree, VGGSERVE_EVENT_WAIT=poll)
# against clWaitForEvents (=block), in turn: the service and the batch job, one GPU against two, FP16 --decode gpu
set -u
i=0
for m in block poll block poll; do
  i=$((i+1))
  echo "=== $i: VGGSERVE_EVENT_WAIT=$m"
  VGGSERVE_EVENT_WAIT=$m timeout 140 python3 benchmarks/scaling.py --gpus 2 --runs service,batch --precisions fp16 \
    --decode gpu --rounds 1 --batch-size 64 --duration 8 --warmup 3 --images 32768 --json $OUT/scaling-$i-$m.json \
    > $OUT/scaling-$i-$m.txt 2>&1; echo "rc $?"
  grep -E "^\| (service|batch)" $OUT/scaling-$i-$m.txt | head -4
  grep -E "^  \| [12] \|" $OUT/scaling-$i-$m.txt | cut -c1-140
  python3 - $OUT/scaling-$i-$m.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for row in d.get("rows", []):
    for side in ("one", "all"):
        for r in row.get(side) or []:
            if "latency_ms" in r:
                cpu = {k: round(v, 3) for k, v in (r.get("cpu_ms_per_image") or {}).items()}
                print(row["what"][:12], side, round(r["images_per_s"]), "cpu ms/image", cpu, "p50",
                      round((r.get("latency_ms") or {}).get("p50") or 0, 1))
PY
done
