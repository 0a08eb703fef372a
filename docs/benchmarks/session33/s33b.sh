# call 2 of session 33: does a group's decode launched ahead of the network overlap it, as one batch's does?
set -u
for g in 4 1 2; do
  timeout 150 python3 benchmarks/device_decode.py --device gpu --images 512 --batch 64 --seconds 3 --no-torch \
    --network fp16 --group $g --json $OUT/dd-g$g.json > $OUT/dd-g$g.txt 2>&1; echo "group $g rc $?"
  grep -E "ahead|engine alone|device ms per batch|early" $OUT/dd-g$g.txt | head -6
done
