"""The wgmma PTX path on the device, step by step: the driver compiles conv_tc.cl with WGMMA = 1 (placeholders),
its PTX is saved, patched (vggserve/runtime/ptx.py) and built again for sm_90a; the build log, or the driver's error,
is printed. The first thing to run on a new driver or GPU when tc_wgmma does not build.

    python benchmarks/wgmma_ptx.py --device gpu [--out DIR] [--tf32] [--tiles BM,BN,STAGES,KB]

Writes DIR/driver.ptx and DIR/patched.ptx (DIR defaults to $OUT or the current folder).
"""

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--tiles", default="128,128,3,64", help="BM,BN,STAGES,KB")
    args = ap.parse_args(argv)

    import pyopencl as cl

    from vggserve.runtime import devices as devs, ptx
    from vggserve.runtime.binaries import program_binary
    from vggserve.runtime.programs import kernel_source

    bm, bn, stages, kb = (int(x) for x in args.tiles.split(","))
    info = devs.resolve(args.device)
    device = devs.cl_device(info)
    ctx = cl.Context([device])
    defines = dict(BM=bm, BN=bn, WARPS_M=bm // 16, WARPS_N=1, STAGES=stages, KB=kb, TF32=int(args.tf32), KS=3, PAD=1,
                   RELU=1, OUT_F32=0, WGMMA=1, MMA_EMULATE=0)
    try:
        program = cl.Program(ctx, kernel_source("conv_tc.cl", defines)).build(options="-cl-mad-enable")
    except cl.Error as exc:  # e.g. PoCL: inline PTX is NVIDIA's only
        print(f"{info.label}: the driver's compile of the placeholders failed: {' '.join(str(exc).split())[:2000]}")
        return 1
    raw = program_binary(program).rstrip(b"\0").decode(errors="replace")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "driver.ptx").write_text(raw)
    print(f"{info.label}: driver PTX {len(raw)} characters, header "
          f"{[line for line in raw.splitlines() if line.startswith(('.version', '.target'))]}")
    patched = ptx.patch(raw)
    (args.out / "patched.ptx").write_text(patched)
    print(f"patched: {patched.count('wgmma.mma_async')} wgmma, {patched.count('wgmma.wait_group')} waits")
    try:
        built = cl.Program(ctx, [device], [patched.encode() + b"\0"]).build()
    except cl.Error as exc:
        print(f"patched build FAILED: {exc}")
        return 1
    print("patched build ok:", built.get_build_info(device, cl.program_build_info.LOG).strip()[:3000] or "(no log)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
