# call 11 of session 27: a recording's cost with its plan's kernels (call 10 timed the recording alone)
set -u
timeout 100 python3 benchmarks/launch_cost.py --precisions fp16,fp8 --iterations 100 --json "$OUT/launch_cost.json" 2>&1 | grep -v Warning | grep -v lambda | grep replayed | cut -c1-120
