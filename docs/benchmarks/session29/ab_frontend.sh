source /work/main/.venv/bin/activate
OUTDIR=${OUTDIR:-/tmp/ab}; mkdir -p $OUTDIR  # old: a checkout of 85d0a14 in /tmp/old
for i in 1 2 3; do for r in v2 classify; do for t in old new; do
  d=/work/main; [ $t = old ] && d=/tmp/old
  (cd $d && timeout 300 python benchmarks/serve_host_floor.py --http-workers 2 --duration 10 --size 64x48 --route $r --json $OUTDIR/$r-$t-$i.json > $OUTDIR/$r-$t-$i.txt 2>&1)
done; done; done
echo done > $OUTDIR/DONE
