# call 2 of session 35: a warp's latency in jpeg_sync round 0: 32 different chunks against one chunk x32 (divergence),
# for 7af81d8's je_run, the lockstep je_sync_run (14- and 13-bit multi tables) and lockstep with every table in local memory
set -u
timeout 300 python3 .whl/v/lat2.py --device gpu --against .whl/v/head_entropy.cl --against .whl/v/lockstep_entropy.cl \
  --against .whl/v/lockstep13_entropy.cl --against .whl/v/local13_entropy.cl > $OUT/lat2.txt 2>&1; echo "lat rc $?"; tail -6 $OUT/lat2.txt
