# call 5 of session 35: the batch job and the service against the engine, this tree (7b12d05) and 7af81d8 in turn
# (old, new, new, old), host_vs_engine; the decoder's device ms per batch for both with the network (group 1)
set -u
mkdir -p /tmp/old && tar -xf .whl/old.tar -C /tmp/old
NEW=$PWD
hve() { # name dir
  (cd $2 && PYTHONPATH=/tmp/site:$2 timeout 125 python3 $2/benchmarks/host_vs_engine.py --weights $VGGSERVE_WEIGHTS \
     --device gpu --batch-size 64 --precision fp16 --images 32768 --batch-decode gpu --runs batch,serve-gpu \
     --engine-seconds 4 --duration 10 --warmup 3 --workdir /tmp/hve-$1 --json $OUT/$1.json > $OUT/$1.txt 2>&1)
  echo "$1 rc $?"; grep -E "^\|" $OUT/$1.txt | head -6; rm -rf /tmp/hve-$1
}
hve hve-old1 /tmp/old; hve hve-new1 $NEW; hve hve-new2 $NEW; hve hve-old2 /tmp/old
dd() { # name dir group extra...
  local name=$1 dir=$2 g=$3; shift 3
  (cd $dir && PYTHONPATH=/tmp/site:$dir timeout 100 python3 $dir/benchmarks/device_decode.py --device gpu --images 512 \
     --batch 64 --seconds 3 --no-torch --group $g "$@" --json $OUT/$name.json > $OUT/$name.txt 2>&1); echo "$name rc $?"
  grep -E "identical|device ms per batch of 64 \(|ahead|engine alone" $OUT/$name.txt | head -4
}
dd oldnet-g1 /tmp/old 1 --network fp16; dd newnet-g1 $NEW 1 --network fp16
cd $OUT && tar -czf all.tgz *.txt *.json && rm -f *.json
