"""What the 8-bit mma.sync instructions become in Hopper's machine code (issue 26): the tensor-core instructions and
conversions in the SASS of one warp-level mma of each kind, compiled without a GPU.

    python benchmarks/mma_sass.py [--nvdisasm PATH]

OpenCL C with the inline PTX the kernels use (mma.clh) -> clang-15 (nvptx64, libclc) -> PTX retargeted to sm_90 ->
ptxas -> nvdisasm. Needs the package's environment (ptx_check.py imports it), clang-15, libclc-15, ptxas and nvdisasm (pip: nvidia-cuda-nvdisasm, whose wheel holds
nvidia/cu13/bin/nvdisasm). Prints, per kind, the count of each tensor-core and conversion instruction in the loop's
SASS, e.g. `e4m3: F2FP.F16.E4M3.UNPACK_B x12, HMMA.16816.F32 x2`.
"""

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from ptx_check import as_sm90, clang_ptx  # benchmarks/: the same clang-15 -> sm_90 PTX as the kernels' check

KINDS = {  # kind: (accumulator type, its constraint, the mma of conv_tc.cl at that precision)
    "f16": ("float", "f", "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"),
    "e4m3": ("float", "f", "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"),
    "u8.s8": ("int", "r", "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32"),
}
SOURCE = r"""
__kernel void k(__global ACC *o, __global const uint *in, int iters) {
    uint a0 = in[0], a1 = in[1], a2 = in[2], a3 = in[3], b0 = in[4], b1 = in[5];
    ACC d0 = 0, d1 = 0, d2 = 0, d3 = 0;
    for (int it = 0; it < iters; ++it) {  /* a fresh operand each time: nothing to hoist out of the loop */
        asm volatile("OP {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                         : "+C"(d0), "+C"(d1), "+C"(d2), "+C"(d3)
                         : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
        a0 = in[it + 6];
    }
    o[get_global_id(0)] = d0 + d1 + d2 + d3;
}
"""
WANTED = re.compile(r"\b((?:[HIQ]MMA|F2FP|I2F|F2I|HADD2|PRMT)[\w.]*)")


def sass_of(kind: str, work: Path, nvdisasm: str) -> Counter:
    acc, constraint, op = KINDS[kind]
    cl, ptx, cubin = work / f"{kind}.cl", work / f"{kind}.ptx", work / f"{kind}.cubin"
    cl.write_text(SOURCE.replace("ACC", acc).replace("OP", op).replace("+C", "+" + constraint))
    clang_ptx(cl, ptx).check_returncode()
    ptx.write_text(as_sm90(ptx.read_text()))
    subprocess.run(["ptxas", "-arch=sm_90", str(ptx), "-o", str(cubin)], check=True)
    sass = subprocess.run([nvdisasm, "-c", str(cubin)], check=True, capture_output=True, text=True).stdout
    return Counter(m.group(1) for line in sass.splitlines() for m in [WANTED.search(line)] if m)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nvdisasm", default=shutil.which("nvdisasm") or "nvdisasm")
    args = ap.parse_args(argv)
    for tool in ("clang-15", "ptxas", args.nvdisasm):
        if not shutil.which(tool):
            print(f"mma_sass: {tool} not found (see this script's docstring)", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory() as tmp:
        for kind in KINDS:
            found = sass_of(kind, Path(tmp), args.nvdisasm)
            print(f"{kind}: " + ", ".join(f"{name} x{n}" for name, n in sorted(found.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
