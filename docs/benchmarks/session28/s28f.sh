# call 6 of session 28: native check of start_decode; the batch job's device decoder, FP16, --decode gpu: its threads
# (chunks.THREADS) and how many decoded chunks it keeps ahead (STARVE_BELOW), each in a copy of this tree
set -u
VGGSERVE_TEST_DEVICE=gpu timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_device_jpeg.py -k "started_ahead or logits_through or reuses_a_buffer or reused_buffer" 2>&1 | tail -1
variant() { # name threads starve
  rm -rf /tmp/$1 && mkdir -p /tmp/$1 && cp -r vggserve benchmarks kernels /tmp/$1/ && \
  sed -i "s/^THREADS = 2$/THREADS = $2/; s/^STARVE_BELOW = 3$/STARVE_BELOW = $3/" /tmp/$1/vggserve/decoding/device/chunks.py && \
  grep -E "^(THREADS|STARVE_BELOW) =" /tmp/$1/vggserve/decoding/device/chunks.py | tr '\n' ' '; echo
}
run() { # name
  echo "=== batch job fp16 decode gpu, $1"
  ( cd /tmp/$1 && PYTHONPATH=/tmp/site:/tmp/$1 timeout 150 python3 benchmarks/host_vs_engine.py --device gpu --batch-size 64 --precision fp16 \
    --runs batch --batch-decode gpu --images 32768 --engine-seconds 3 --json "$OUT/batch-$1.json" > "$OUT/batch-$1.txt" 2>&1; echo "rc $?" )
  grep -E "^\| batch|decode groups" "$OUT/batch-$1.txt" | cut -c1-260
}
variant t2s3 2 3; variant t3s3 3 3; variant t2s5 2 5; variant t3s5 3 5
run t2s3; run t3s3; run t2s5; run t3s5; run t2s3
