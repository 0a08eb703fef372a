# call 4 of session 28: the resize's device time; each batch's decode launched before the previous batch's is waited for
set -u
which nsys ncu 2>&1 | head -3
echo "=== device_decode group 1 network fp16 (decode ahead)"
timeout 200 python3 benchmarks/device_decode.py --device gpu --images 512 --batch 64 --seconds 3 --no-torch --network fp16 --json "$OUT/decode-ahead.json" 2>&1 | grep -v -i "warning\|lambda" | tee -a "$OUT/log.txt"
