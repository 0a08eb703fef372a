# call 7 of session 30 (nvidia-h200-x2): the compressed JPEGs copied on the device worker's thread (this tree) against
# the copying threads (HEAD, 6aa007b, in /tmp/old), and this tree with a 0.5 ms GIL switch interval (sitecustomize);
# the service on two GPUs, in turn; the batch job, one rank
set -u
mkdir -p /tmp/old /tmp/sw && tar -xf .whl/old.tar -C /tmp/old
echo "import sys; sys.setswitchinterval(0.0005)" > /tmp/sw/sitecustomize.py
NEW=$PWD
serve() {  # $1 tag, $2 tree, $3 extra PYTHONPATH
  echo "=== $1: service fp16 --decode gpu --device all, 512 in flight"
  (cd $2 && PYTHONPATH=$3/tmp/site:$2 timeout 100 python3 benchmarks/serve_saturation.py --weights $VGGSERVE_WEIGHTS \
    --device all --decode gpu --precision fp16 --max-batch-size 64 --concurrency 512 --duration 10 --warmup 3 \
    --skip-engine --json "$OUT/serve-$1.json" > "$OUT/serve-$1.txt" 2>&1); echo "rc $?"
  grep -E '^(service|cpu)' "$OUT/serve-$1.txt" | cut -c1-160
}
for i in 1 2; do
  serve new$i $NEW ""
  serve old$i /tmp/old ""
  serve sw$i $NEW "/tmp/sw:"
done
for t in new old; do
  tree=$NEW; [ $t = old ] && tree=/tmp/old
  echo "=== $t: batch job fp16 --decode gpu, one rank, 32768 JPEGs"
  (cd $tree && PYTHONPATH=/tmp/site:$tree timeout 100 python3 benchmarks/host_vs_engine.py --device gpu --batch-size 64 \
    --precision fp16 --runs batch --batch-decode gpu --images 32768 --engine-seconds 2 --workdir /tmp/hve \
    --json "$OUT/batch-$t.json" > "$OUT/batch-$t.txt" 2>&1); echo "rc $?"
  grep -E "^\| batch" "$OUT/batch-$t.txt" | cut -c1-200
done
