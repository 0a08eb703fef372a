"""Run `vggserve` (argv after --) with experimental tweaks from the environment (session 33):
VARIANT_SWITCH=S   sys.setswitchinterval(S) in the rank
VARIANT_PRELOAD=1  every input file read into memory before the job starts; FileArena.read answers from there (the
                   files then cost the decode threads no system calls: an upper bound for reading them elsewhere)"""
import os
import sys
import time

if os.environ.get("VARIANT_SWITCH"):
    sys.setswitchinterval(float(os.environ["VARIANT_SWITCH"]))
argv = sys.argv[sys.argv.index("--") + 1:]
if os.environ.get("VARIANT_PRELOAD"):
    import numpy as np

    import vggserve.filearena as fa
    from vggserve.distributed.inputs import list_inputs

    t0 = time.perf_counter()
    blob = {p: np.fromfile(p, np.uint8) for p in list_inputs(argv[argv.index("--input") + 1])}
    print(f"preloaded {len(blob)} files in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    orig = fa.FileArena.read

    def read(self, sources):
        got = [blob.get(s) if isinstance(s, str) else None for s in sources]
        if any(g is None for g in got):
            return orig(self, sources)
        return got

    fa.FileArena.read = read
from vggserve.cli import main

sys.exit(main(argv))
