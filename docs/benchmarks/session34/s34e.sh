# call 5 of session 34: the entropy decoder's chunking and checkpoints swept on this tree (device ms per batch of 64,
# groups 1 and 4): chunk bytes 128/192/256, checkpoints 3/5/7/11
set -u
dd() { # name group extra...
  local name=$1 g=$2; shift 2
  timeout 100 python3 benchmarks/device_decode.py --device gpu --images 256 --batch 64 --seconds 2 --no-torch \
     --group $g "$@" --json $OUT/$name.json > $OUT/$name.txt 2>&1
  echo "$name rc $? $(grep -E 'device ms per batch of 64 \(' $OUT/$name.txt | head -1 | sed 's/.*sequence)://') | $(grep -oE 'identical to Pillow: [0-9/]+' $OUT/$name.txt)"
}
for g in 1 4; do
  for ck in 3 5 7 11; do dd c192-k$ck-g$g $g --chunk-bytes 192 --checkpoints $ck; done
  for cb in 128 256; do for ck in 3 7; do dd c$cb-k$ck-g$g $g --chunk-bytes $cb --long-chunk-bytes 384 --checkpoints $ck; done; done
done
cd $OUT && tar -czf all.tgz *.txt *.json && rm -f *.json *.txt
