"""FP8 weight quantisation at engine start: ops/eightbit.py quantise_weights (per-channel s_w, float64 W / s_w,
e4m3 codes) and the layout's second encode (tensorcore.tc_weights: the e4m3 values back to codes), on a matrix of
VGG16's classifier.0 shape (25088 x 4096 float32, 103M weights, the largest of the 138M an FP8 engine quantises at
every start).

    python3 benchmarks/fp8_weights.py [--inputs 25088 --outputs 4096] [--repeats 3] [--skip-old]

Prints ms per step, "old" being the whole-matrix float64 quotient encoded by e4m3.encode_reference (the log2-based
encode the engine used before the bit-level one) and "new" the engine's functions; both give the same codes (checked
here, and by tests/test_e4m3.py on ties and specials). The old path's temporaries take several GB. CPU only: a
figure of the host, so say which CPU (and what else ran on it).
"""

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vggserve.ops.eightbit import quantise_weights, weight_scales  # noqa: E402
from vggserve.quant import e4m3  # noqa: E402


def old_quantise(w: np.ndarray):
    """quantise_weights as it was: the whole matrix in float64, then the reference encode."""
    s = weight_scales(w)
    q = w.astype(np.float64) / s.astype(np.float64).reshape((-1,) + (1,) * (w.ndim - 1))
    return e4m3.encode_reference(q), s


def best_ms(fn, repeats: int):
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t) * 1e3)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inputs", type=int, default=25088, help="input features (classifier.0: 25088)")
    ap.add_argument("--outputs", type=int, default=4096, help="output channels (classifier.0: 4096)")
    ap.add_argument("--repeats", type=int, default=3, help="best of this many runs of each new step (old: one)")
    ap.add_argument("--skip-old", action="store_true", help="time only the new path")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    # (out, in) as the engine holds it; std 0.01 as VGG16's FC weights, many of W / s_w below 2^-6
    w = (rng.standard_normal((args.outputs, args.inputs), dtype=np.float32) * np.float32(0.01))
    print(f"weights {w.shape} float32 ({w.size / 1e6:.0f}M), CPU: {os.cpu_count()} cores visible, "
          f"numpy {np.__version__}, e4m3.CHUNK {e4m3.CHUNK}")
    ms_scales, _ = best_ms(lambda: weight_scales(w), args.repeats)
    ms_new, (codes, s) = best_ms(lambda: quantise_weights(w), args.repeats)
    values = e4m3.decode(codes)
    ms_encode32, again = best_ms(lambda: e4m3.encode(values), args.repeats)
    assert np.array_equal(again, codes), "the layout's encode of the decoded values gives the codes back"
    print(f"new: quantise_weights {ms_new:.0f} ms (of which weight_scales {ms_scales:.0f} ms); "
          f"encode of the float32 e4m3 values (the layout's) {ms_encode32:.0f} ms")
    if not args.skip_old:
        ms_old, (old_codes, old_s) = best_ms(lambda: old_quantise(w), 1)
        same = np.array_equal(old_codes, codes) and np.array_equal(old_s, s)
        del old_codes
        ms_old32, _ = best_ms(lambda: e4m3.encode_reference(values), 1)
        print(f"old: quantise_weights {ms_old:.0f} ms; encode of the float32 e4m3 values {ms_old32:.0f} ms")
        print(f"speed-up: quantise_weights {ms_old / ms_new:.1f}x, layout encode {ms_old32 / ms_encode32:.1f}x; "
              f"codes identical: {same}")
        if not same:
            raise SystemExit("the new codes differ from the old ones")


if __name__ == "__main__":
    main()
