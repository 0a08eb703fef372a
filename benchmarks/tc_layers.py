"""Tensor-core convolution kernels (kernels/conv_tc.cl) alone: correctness on awkward sizes, then every VGG16 conv
shape timed per tile configuration, beside PyTorch/cuDNN's own convolution at the same precision.

    python benchmarks/tc_layers.py --device gpu --batch 64 [--configs all] [--out DIR]

Prints, per shape and precision: each configuration's ms and TFLOP/s, cuDNN's (FP16 channels_last / TF32), and the
fraction of the mma.sync ceiling (625 TFLOP/s FP16, 313 TF32 on the H100). With --out, saves each built program's
PTX and `ptxas -v` (registers, spills) where ptxas exists.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyopencl as cl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vggserve.runtime.programs import kernel_source  # noqa: E402

MF = cl.mem_flags
CEILING = {0: 625.0, 1: 313.0}
CONFIGS = {
    "128x128w2x2s3": dict(BM=128, BN=128, WARPS_M=2, WARPS_N=2, STAGES=3, KB=64),
    "128x128w2x4s3": dict(BM=128, BN=128, WARPS_M=2, WARPS_N=4, STAGES=3, KB=64),
    "128x64w2x2s4": dict(BM=128, BN=64, WARPS_M=2, WARPS_N=2, STAGES=4, KB=64),
    "256x128w4x2s2": dict(BM=256, BN=128, WARPS_M=4, WARPS_N=2, STAGES=2, KB=64),
    "128x256w2x4s2": dict(BM=128, BN=256, WARPS_M=2, WARPS_N=4, STAGES=2, KB=64),
    "64x64w2x2s3k128": dict(BM=64, BN=64, WARPS_M=2, WARPS_N=2, STAGES=3, KB=128),
    "64x128w2x2s3": dict(BM=64, BN=128, WARPS_M=1, WARPS_N=4, STAGES=3, KB=64),
    "256x128w4x2s4k32": dict(BM=256, BN=128, WARPS_M=4, WARPS_N=2, STAGES=4, KB=32),
    "128x256w2x4s4k32": dict(BM=128, BN=256, WARPS_M=2, WARPS_N=4, STAGES=4, KB=32),
    "128x128w2x2s6k32": dict(BM=128, BN=128, WARPS_M=2, WARPS_N=2, STAGES=6, KB=32),
    "128x128w2x4s6k32": dict(BM=128, BN=128, WARPS_M=2, WARPS_N=4, STAGES=6, KB=32),
}
SHAPES = [(3, 64, 224), (64, 64, 224), (64, 128, 112), (128, 128, 112), (128, 256, 56), (256, 256, 56),
          (256, 512, 28), (512, 512, 28), (512, 512, 14)]


def ru(x, m):
    return (x + m - 1) // m * m


class Conv:
    def __init__(self, ctx, q, p, tf32, ks=3, relu=1, emulate=0, out_dir=None):
        self.ctx, self.q, self.p, self.tf32, self.ks = ctx, q, p, tf32, ks
        defs = dict(p, TF32=tf32, KS=ks, PAD=(ks - 1) // 2, RELU=relu, MMA_EMULATE=emulate)
        t0 = time.perf_counter()
        self.prg = cl.Program(ctx, kernel_source("conv_tc.cl", defs)).build()
        self.build_s = time.perf_counter() - t0
        if out_dir is not None:
            name = "tc_" + "_".join(f"{k}{v}" for k, v in sorted(defs.items()))
            ptx = self.prg.get_info(cl.program_info.BINARIES)[0]
            (out_dir / f"{name}.ptx").write_bytes(ptx)
            self.ptxas = ptxas_report(out_dir / f"{name}.ptx")
        self.kernel = cl.Kernel(self.prg, "conv_tc")
        self.elem = 4 if tf32 else 2
        self.vec, self.bk = 16 // self.elem, p["KB"] // self.elem
        self.dt = np.float32 if tf32 else np.float16

    def layouts(self, x, w, b):
        n, cin, h, wd = x.shape
        cout = w.shape[0]
        cpad, cstore = ru(cin, self.vec), ru(cout, self.vec)
        xin = np.zeros((n, h, wd, cpad), self.dt)
        xin[..., :cin] = x.transpose(0, 2, 3, 1)
        ks = self.ks
        k = ks * ks * cpad
        kpad, npad = ru(k, self.bk), ru(cout, self.p["BN"])
        wl = np.zeros((cout, ks, ks, cpad), np.float32)
        wl[..., :cin] = w.transpose(0, 2, 3, 1)
        wdev = np.zeros((npad, kpad), self.dt)
        wdev[:cout, :k] = wl.reshape(cout, k)
        bdev = np.zeros(npad, np.float32)
        bdev[:cout] = b
        if self.tf32:  # stored operands are TF32 values (conv_tc.cl's banner)
            xin, wdev = rna(xin), rna(wdev)
        return xin, wdev, bdev, cpad, cstore, kpad, npad

    def launch(self, bufs, n, h, w, cpad, cstore, kpad, npad):
        p = self.p
        threads = 32 * p["WARPS_M"] * p["WARPS_N"]
        npix = n * h * w
        groups_n = npad // p["BN"]
        groups = ru(npix, p["BM"]) // p["BM"] * groups_n
        ntiles = kpad // self.bk
        args = (*bufs, np.int32(cpad), np.int32(h), np.int32(w), np.int32(npix), np.int32(cstore), np.int32(kpad),
                np.int32(groups_n), np.int32(ntiles))
        return self.kernel(self.q, (groups * threads, 1), (threads, 1), *args)


def ptxas_report(path):
    exe = shutil.which("ptxas") or ("/usr/local/cuda/bin/ptxas" if os.path.exists("/usr/local/cuda/bin/ptxas") else None)
    if exe is None:
        return None
    r = subprocess.run([exe, "-arch=sm_90", "-v", str(path), "-o", "/dev/null"], capture_output=True, text=True)
    return " ".join(line.strip() for line in (r.stdout + r.stderr).splitlines() if "registers" in line or "spill" in line
                    or "error" in line.lower())[:400]


def rna(a):
    """float32 -> float32 rounded to TF32 as cvt.rna.tf32.f32 does."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def reference(x, w, b, tf32, dt):
    xq, wq = x.astype(dt).astype(np.float64), w.astype(dt).astype(np.float64)
    if tf32:
        xq, wq = rna(xq).astype(np.float64), rna(wq).astype(np.float64)
    n, cin, h, wd = x.shape
    ks = w.shape[2]
    pad = (ks - 1) // 2
    xp = np.pad(xq, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ref = np.zeros((n, w.shape[0], h, wd))
    for ky in range(ks):
        for kx in range(ks):
            ref += np.einsum("nchw,oc->nohw", xp[:, :, ky:ky + h, kx:kx + wd], wq[:, :, ky, kx])
    return np.maximum(ref + b.reshape(1, -1, 1, 1), 0)


def check(ctx, q, emulate, out_dir):
    rng = np.random.default_rng(1)
    bad = 0
    for tf32 in (0, 1):
        for name, p in CONFIGS.items():
            conv = Conv(ctx, q, p, tf32, emulate=emulate, out_dir=out_dir)
            for (n, cin, cout, h, w) in [(1, 3, 8, 5, 7), (2, 13, 21, 6, 5), (3, 64, 72, 9, 11), (1, 40, 130, 17, 3)]:
                x = rng.standard_normal((n, cin, h, w)).astype(np.float32)
                wt = (rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(cin * 9)).astype(np.float32)
                b = (rng.standard_normal(cout) * 0.1).astype(np.float32)
                xin, wdev, bdev, cpad, cstore, kpad, npad = conv.layouts(x, wt, b)
                out = np.full((n * h * w, cstore), np.nan, conv.dt)
                bufs = [cl.Buffer(ctx, MF.COPY_HOST_PTR, hostbuf=a) for a in (xin, wdev, bdev, out)]
                conv.launch(bufs, n, h, w, cpad, cstore, kpad, npad)
                cl.enqueue_copy(q, out, bufs[3])
                q.finish()
                got = out.astype(np.float64).reshape(n, h, w, cstore)
                ref = reference(x, wt, b, tf32, conv.dt)
                err = np.abs(got[..., :cout].transpose(0, 3, 1, 2) - ref).max() / np.abs(ref).max()
                ok = err < 2e-3 and np.all(got[..., cout:] == 0)
                bad += not ok
                if not ok:
                    print(f"FAIL tf32={tf32} {name} n={n} cin={cin} cout={cout} {h}x{w}: rel err {err:.2e}")
            print(f"checked tf32={tf32} {name}: build {conv.build_s:.2f} s  ptxas: {getattr(conv, 'ptxas', None)}",
                  flush=True)
    print(f"correctness: {'all OK' if not bad else f'{bad} FAILED'}")
    return bad


def time_ours(ctx, qp, conv, n, cin, cout, size, reps):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, cin, size, size)).astype(np.float32)
    w = (rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(cin * 9)).astype(np.float32)
    b = np.zeros(cout, np.float32)
    xin, wdev, bdev, cpad, cstore, kpad, npad = conv.layouts(x, w, b)
    out = cl.Buffer(ctx, MF.READ_WRITE, n * size * size * cstore * conv.elem)
    bufs = [cl.Buffer(ctx, MF.COPY_HOST_PTR, hostbuf=a) for a in (xin, wdev, bdev)] + [out]
    conv.launch(bufs, n, size, size, cpad, cstore, kpad, npad).wait()
    times = []
    for _ in range(reps):
        ev = conv.launch(bufs, n, size, size, cpad, cstore, kpad, npad)
        ev.wait()
        times.append((ev.profile.end - ev.profile.start) * 1e-6)
    return float(np.median(times))


def time_torch(n, cin, cout, size, tf32, reps):
    import torch
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = bool(tf32)
    torch.backends.cuda.matmul.allow_tf32 = bool(tf32)
    dt = torch.float32 if tf32 else torch.float16
    conv = torch.nn.Conv2d(cin, cout, 3, padding=1).cuda().to(dt)
    x = torch.randn(n, cin, size, size, device="cuda", dtype=dt)
    if not tf32:
        conv = conv.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    f = lambda: torch.relu(conv(x))  # noqa: E731
    with torch.inference_mode():
        for _ in range(3):
            f()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            f()
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e))
    return float(np.median(times))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--batches", default=None, help="comma list: time each batch (overrides --batch)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--configs", default="all")
    ap.add_argument("--precisions", default="0,1", help="TF32 flags to time: 0 = FP16, 1 = TF32")
    ap.add_argument("--emulate", type=int, default=0)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--skip-check", action="store_true", help="no correctness pass first (e.g. under a profiler)")
    ap.add_argument("--shapes", default=None, help="comma list of CINxCOUTxSIZE (default: every VGG16 conv shape)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    from vggserve.runtime import devices as devs
    info = devs.resolve(args.device)
    dev = devs.cl_device(info)
    ctx = cl.Context([dev])
    q = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    print(f"device: {info.label}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    if not args.skip_check and check(ctx, q, args.emulate, args.out):
        return 1
    shapes = [tuple(int(v) for v in sh.split("x")) for sh in args.shapes.split(",")] if args.shapes else SHAPES
    names = list(CONFIGS) if args.configs == "all" else args.configs.split(",")
    rows = []
    batches = [int(b) for b in args.batches.split(",")] if args.batches else [args.batch]
    for tf32 in (int(t) for t in args.precisions.split(",")):
        convs = {nm: Conv(ctx, q, CONFIGS[nm], tf32, emulate=args.emulate) for nm in names}
        for batch in batches:
            total_best = total_torch = 0.0
            for cin, cout, size in shapes:
                flops = 2.0 * batch * size * size * cin * cout * 9
                res = {nm: time_ours(ctx, q, c, batch, cin, cout, size, args.reps) for nm, c in convs.items()}
                tt = None if args.no_torch else time_torch(batch, cin, cout, size, tf32, args.reps)
                best = min(res, key=res.get)
                times = 2 if (cin, cout, size) in ((256, 256, 56), (512, 512, 28), (512, 512, 14)) else 1
                total_best += res[best] * times
                total_torch += (tt or 0) * times
                line = "  ".join(f"{nm} {ms:.3f}" for nm, ms in res.items())
                tf = flops / res[best] / 1e9
                print(f"{'TF32' if tf32 else 'FP16'} b{batch} {cin}x{cout}x{size}: best {best} {res[best]:.3f} ms "
                      f"{tf:.0f} TFLOP/s ({tf / CEILING[tf32]:.2f} of ceiling); cuDNN "
                      f"{tt if tt is None else round(tt, 3)} ms{'' if not tt else f' ratio {tt / res[best]:.2f}'} | {line}",
                      flush=True)
                rows.append(dict(tf32=tf32, batch=batch, shape=[cin, cout, size], ours=res, torch_ms=tt, best=best))
            print(f"{'TF32' if tf32 else 'FP16'} all 13 convs at batch {batch}: ours (best per layer) "
                  f"{total_best:.2f} ms, cuDNN {total_torch:.2f} ms")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
