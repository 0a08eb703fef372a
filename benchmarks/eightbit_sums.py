"""The 8-bit kernels' sums against numpy's exact ones, per entry, operand kind and layer shape: where wgmma's native
e4m3 or s8 x u8 forms (wgmma_halo) and mma.sync's (tc_halo) part from an exact sum, and by how much.

    python benchmarks/eightbit_sums.py --device gpu [--precisions fp8,int8] [--algos wgmma_halo,tc_halo] [--fast]
        [--promote 2,3]

At FP8, wgmma_halo promotes each tap's sum into FP32 accumulators (conv_wg_halo.cl, PROMOTE = 1); --fast also runs
it with PROMOTE = 0 (the tensor cores accumulate the whole sum), as "wgmma_halo/fast"; --promote P,... with each
P taps' sums promoted, as "wgmma_halo/P".

Each layer is a 3x3 convolution whose output is the float32 sums (the last layer's store: y = sum * cs[n] + bias[n],
no ReLU), on three kinds of operands:
  small    integer operands (activations 0..3, weights -7..7 after quantisation): every partial sum is an integer
           below 2^13, exact in any accumulator of 14 significant bits or more; an error here is a layout error;
  exact    test_fp8_kernels' integers (activations up to 16, weights up to 448): exact in FP32, not in fewer bits;
  random   normal activations and weights, as the network's.
Printed per row: the largest |device - numpy| over the largest |numpy|; the largest |device - numpy| over the sum of
the products' magnitudes (sum |products|, scaled: the unit of an accumulator's rounding, whatever the signs); and the
share of outputs beyond FP32 accumulation's bound ((K - 1) 2^-24 sum |products|, scaled). INT8's sums are integers:
any difference is an error.
"""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = [(1, 13, 21, 11, 17), (2, 64, 64, 14, 14), (2, 256, 128, 14, 14), (1, 512, 128, 14, 14)]


def operands(kind: str, prec, shape, rng):
    """(activation codes (uint8 NHWC), their values, weights float32, in_scale)."""
    from vggserve.quant import e4m3

    n, cin, cout, h, w = shape
    if prec.int8:
        hi = {"small": 4, "exact": 256, "random": 256}[kind]
        x = rng.integers(0, hi, (n, h, w, cin)).astype(np.uint8)
        wq = rng.integers(-7, 8, (cout, cin, 3, 3)) if kind == "small" else rng.integers(-127, 128, (cout, cin, 3, 3))
        wq.reshape(cout, -1)[:, 0] = 127  # amax 127: s_w = amax / 127 = 1 when the weights are the codes
        return x, x.astype(np.float64), wq.astype(np.float32), 1.0
    if kind == "random":
        xf = rng.standard_normal((n, h, w, cin)).astype(np.float32)
        s = float(np.abs(xf).max()) / 448
        codes = e4m3.encode(xf / s)
        wt = (rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(cin * 9)).astype(np.float32)
        return codes, e4m3.decode(codes).astype(np.float64), wt, s
    vals = np.arange(4.0) if kind == "small" else np.array([0, 1, 2, 3, 4, 6, 8, 12, 16.0])
    xv = rng.choice(vals, (n, h, w, cin))
    q = rng.choice(np.arange(-7.0, 8.0) if kind == "small" else np.array([-448, -96, -13, -2, 0, 1, 5, 40, 448.0]),
                   (cout, cin, 3, 3))
    q.reshape(cout, -1)[:, 0] = 448.0  # amax 448: s_w = 1, the codes are the weights
    return e4m3.encode(xv), xv, q.astype(np.float32), 1.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--precisions", default="fp8,int8")
    ap.add_argument("--algos", default="wgmma_halo,tc_halo")
    ap.add_argument("--fast", action="store_true", help="fp8: wgmma_halo with PROMOTE = 0 too")
    ap.add_argument("--promote", default="", help="fp8: wgmma_halo with these PROMOTE intervals too (taps, 2 to 9)")
    args = ap.parse_args(argv)

    import pyopencl as cl

    from vggserve.ops import precision as precisions, registry
    from vggserve.ops.registry import BuildEnv, LayerSpec
    from vggserve.runtime import caps as device_caps, devices as devs
    from vggserve.runtime.programs import ProgramCache

    info = devs.resolve(args.device)
    device = devs.cl_device(info)
    caps = device_caps.of(device, info.kind, info.label)
    ctx = cl.Context([device])
    queue, cache = cl.CommandQueue(ctx), ProgramCache(ctx, device, progress=False)
    print(f"device: {info.label}; wgmma {caps.wgmma}; fp8 {caps.fp8}")
    rng = np.random.default_rng(0)
    for pname in args.precisions.split(","):
        prec = precisions.get(pname)
        runs = [(name, {}) for name in args.algos.split(",")]
        if prec.fp8 and "wgmma_halo" in args.algos.split(","):
            runs += [("wgmma_halo", {"PROMOTE": 0})] if args.fast else []
            runs += [("wgmma_halo", {"PROMOTE": int(p)}) for p in args.promote.split(",") if p]
        for name, extra in runs:
            algo = registry.get(name)
            label = name + ("" if not extra else "/fast" if extra["PROMOTE"] == 0 else f"/{extra['PROMOTE']}")
            if not algo.available(caps, prec):
                print(f"{pname} {name}: not available here")
                continue
            params = {**algo.default(caps, prec), **extra}
            for kind in ("small", "exact", "random"):
                for shape in SHAPES:
                    n, cin, cout, h, w = shape
                    codes, xv, wt, s_in = operands(kind, prec, shape, rng)
                    layer = LayerSpec("conv3x3", cin, cout, h, relu=False, last=True)
                    op = algo.make(ctx, cache, params, prec, layer, wt, np.zeros(cout, np.float32),
                                   BuildEnv(caps=caps, max_batch=n), in_scale=s_in)
                    wq = np.asarray(op.scales.weight, np.float64)  # the quantised weights as the kernel has them
                    cs = op.scales.cs.astype(np.float64)
                    a = np.pad(xv, ((0, 0), (1, 1), (1, 1), (0, 0)))
                    ref, mag = np.zeros((n, h, w, cout)), np.zeros((n, h, w, cout))
                    for ky in range(3):
                        for kx in range(3):
                            tap = a[:, ky:ky + h, kx:kx + w, :]
                            ref += tap @ wq[:, :, ky, kx].T
                            mag += np.abs(tap) @ np.abs(wq[:, :, ky, kx]).T
                    ref, mag = ref * cs, mag * cs
                    bound = (cin * 9 - 1) * 2.0 ** -24 * mag
                    xin = np.zeros((n, h, w, op.cpad), np.uint8)
                    xin[..., :cin] = codes
                    src = cl.Buffer(ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=xin)
                    out = np.full((n * h * w, op.cstore), np.nan, np.float32)
                    dst = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=out)
                    op.enqueue(queue, src, dst, n, h, w)
                    cl.enqueue_copy(queue, out, dst)
                    queue.finish()
                    got = out.reshape(n, h, w, op.cstore)[..., :cout].astype(np.float64)
                    err = np.abs(got - ref)
                    top = max(float(np.abs(ref).max()), 1e-30)
                    beyond = float(np.mean(err > bound + 1e-6 * np.abs(ref)))
                    per_mag = float(np.max(err / np.maximum(mag, 1e-30)))
                    print(f"{pname} {label:15s} {kind:6s} {'x'.join(map(str, shape)):>16s}: max err / max |sum| "
                          f"{float(err.max()) / top:.2e}, / sum |products| {per_mag:.2e}, beyond FP32's bound "
                          f"{beyond:.3f}, NaN {int(np.isnan(got).sum())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
