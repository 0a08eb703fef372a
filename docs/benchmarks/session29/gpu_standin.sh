# The front ends in front of a (stand-in) device decoder: 500x375 q90 JPEGs sent compressed, both routes in turn.
source /work/main/.venv/bin/activate
OUTDIR=${OUTDIR:-/tmp/gs}; mkdir -p $OUTDIR
for i in 1 2 3; do for r in classify v2; do
  timeout 300 python benchmarks/serve_host_floor.py --http-workers 2 --duration 10 --decode gpu --route $r \
      --json $OUTDIR/gpu-$r-$i.json > $OUTDIR/gpu-$r-$i.txt 2>&1
done; done
