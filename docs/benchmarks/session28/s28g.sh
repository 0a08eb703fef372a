# call 7 of session 28: the network with the device decode in three orders: serial, launched a batch ahead, early take
set -u
for i in 1 2; do
timeout 200 python3 benchmarks/device_decode.py --device gpu --images 512 --batch 64 --seconds 3 --no-torch --network fp16 --json "$OUT/orders-$i.json" 2>&1 | grep -E "network|engine alone"
done
