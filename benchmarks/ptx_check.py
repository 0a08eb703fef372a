"""The tensor-core kernels' native (non-emulated) code, compiled without an NVIDIA driver: every tile configuration of
the shipped tuning tables (and the sparse entries' tuned tiles), at each precision the kernel runs, built from this
tree's kernels/ and from another revision's, compared by `ptxas -arch=sm_90 -v` (registers, spills, stack) and
by the PTX itself.

    python benchmarks/ptx_check.py [--base main] [--candidates] [--only tc_halo] [--precisions int8] [--keep DIR]

The source is what the host hands the driver (runtime/programs.kernel_source: `#define`s, then the file with its
`#include "x.clh"` expanded), compiled as OpenCL C 1.2 by clang-15 for nvptx64-nvidia-nvcl with libclc's NVPTX
built-ins (Debian: apt-get install clang-15 libclc-15), to PTX 7.5 for sm_86 (the newest clang-15 knows), whose
header is then set to PTX 8.0 / sm_90 so that ptxas assembles it as NVIDIA's OpenCL would (`.target sm_90`, issue 13).
NVIDIA's own OpenCL compiler is not clang, so the figures are a proxy for the driver's; what this shows is whether a
source change changes the code: "ptx" says whether the two revisions' PTX is the same text (comments and blank lines
aside; a reordering of the same instructions differs), "cubin" whether ptxas made the same binary of it, byte for
byte (the machine code, so the instructions, unchanged).

Columns: kernel, precision, the variant built (conv / split-K / last FC layer; POOL=1 the fused pooling; at fp8 also
which side is e4m3), the tiles, then registers, spill bytes (stores+loads), stack frame and shared memory before ->
after. The 8-bit programs (tc_gemm, tc_halo, wgmma_halo with FP8 / OUT_FP8 or INT8 / OUT_INT8, built by --candidates
where no shipped table has them) are assembled as PTX 8.4 (the first version with mma.sync on e4m3) or 8.0 (INT8's
mma.sync u8.s8); a base revision without them shows "-" before.
"""

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from vggserve.runtime.params import shipped_file  # noqa: E402
from vggserve.runtime.programs import kernel_source  # noqa: E402

LIBCLC = Path("/usr/lib/clc/nvptx64--nvidiacl.bc")
FILES = {"tc_gemm": ("conv_tc.cl", "conv_tc"), "tc_wgmma": ("conv_tc.cl", "conv_tc"),
         "tc_halo": ("conv_tc_halo.cl", "conv_tc_halo"), "tc_halo_wgmma": ("conv_tc_halo.cl", "conv_tc_halo"),
         "tc_sparse24": ("conv_tc_sparse.cl", "conv_tc_sparse"),
         "tc_halo_sparse24": ("conv_tc_halo_sparse.cl", "conv_tc_halo_sparse"),
         "wgmma_halo": ("conv_wg_halo.cl", "conv_wg_halo"), "tc_gemv8": ("fc_eightbit_gemv.cl", "fc_eightbit_gemv"),
         "tc_gemv": ("fc_half_gemv.cl", "fc_half_gemv")}


WGMMA_ALGOS = ("tc_wgmma", "tc_halo_wgmma", "wgmma_halo")  # built with WGMMA = 1, patched and assembled for sm_90a
DENSE_ALGOS = ("tc_gemm", "tc_wgmma", "tc_halo", "tc_halo_wgmma", "wgmma_halo")  # FP16 and TF32 (the 2:4 ones: FP16 only)


def tunables(algo: str) -> tuple:
    from vggserve.ops import eightbit_gemv, tensorcore, tensorcore_gemv, tensorcore_sparse, wgmma_halo

    return {"tc_gemv": tensorcore_gemv.TUNABLES, "tc_gemv8": eightbit_gemv.TUNABLES, "wgmma_halo": wgmma_halo.TUNABLES,
            "tc_gemm": tensorcore.TUNABLES, "tc_wgmma": tensorcore.WGMMA_TUNABLES, "tc_halo": tensorcore.HALO_TUNABLES,
            "tc_halo_wgmma": tensorcore.HALO_WGMMA_TUNABLES, "tc_sparse24": tensorcore_sparse.TUNABLES,
            "tc_halo_sparse24": tensorcore_sparse.HALO_TUNABLES}[algo]


def pools(algo: str, tiles: dict) -> bool:
    """Whether the registry entry can fuse the pooling under these tiles (registry `fuses_pool`)."""
    from vggserve.ops import registry

    return registry.get(algo).fuses_pool({"ALGO": algo, **tiles})


def eight_bit_variants(algo: str, base: dict, precision: str = "fp8") -> list[tuple[str, dict]]:
    """(label, defines) of the 8-bit programs (ops/eightbit.py), FP8 (e4m3) or INT8 (u8 x s8): codes in and out;
    codes in, FP16 out (before an FP16 layer); FP16 in, codes out (a first convolution that stays FP16); codes in,
    the logits; split-K; the fused pooling."""
    flag, out, c = ("INT8", "OUT_INT8", "u8") if precision == "int8" else ("FP8", "OUT_FP8", "e4m3")
    if algo == "tc_gemv8":  # FC only: codes out, FP16 out (before classifier.6), the logits
        fc = {**base, flag: 1, "RELU": 1}
        return [(f"fc {c}", {**fc, out: 1}), (f"fc {c} in, fp16 out", fc),
                (f"fc last {c} in", {**fc, "RELU": 0, "OUT_F32": 1})]
    eight = {**base, flag: 1, "TF32": 0, "RELU": 1, "OUT_F32": 0}
    if algo == "tc_gemm":
        conv = {**eight, "KS": 3, "PAD": 1, out: 1}
        return [(f"conv {c}", conv), (f"conv {c} split-K", {**conv, "SPLITK": 1}),
                (f"conv fp16 in, {c} out", {**conv, flag: 0}),
                (f"fc {c} in, fp16 out", {**eight, "KS": 1, "PAD": 0}),
                (f"fc last {c} in", {**eight, "KS": 1, "PAD": 0, "RELU": 0, "OUT_F32": 1})]
    conv = {**eight, out: 1, "POOL": 0}
    # wgmma_halo at FP8: each tap's sum promoted (the default), each two taps' (PROMOTE=2), none (fast)
    promote = ([(f"conv {c} PROMOTE={p}", {**conv, "PROMOTE": p}) for p in (2, 0)]
               if algo == "wgmma_halo" and precision == "fp8" else [])
    return ([(f"conv {c}", conv)] + promote +
            ([(f"conv {c} POOL=1", {**conv, "POOL": 1})] if pools(algo, base) else []) +
            [(f"conv fp16 in, {c} out", {**conv, flag: 0})])


def variants(algo: str, precision: str, tiles: dict) -> list[tuple[str, dict]]:
    """(label, defines) of the programs the engine builds from one tile configuration."""
    base = {**tiles, "MMA_EMULATE": 0, **({"WGMMA": 1} if algo in WGMMA_ALGOS else {})}
    if algo == "wgmma_halo":
        from vggserve.ops.wgmma_halo import layout_defines

        base.update(layout_defines(tiles["TH"]))
    if precision in ("fp8", "int8"):
        return eight_bit_variants(algo, base, precision)
    if algo == "tc_gemv":  # FC only: FP16 out, the logits
        return [("fc", {**base, "RELU": 1}), ("fc last", {**base, "RELU": 0, "OUT_F32": 1})]
    if algo in ("tc_gemm", "tc_wgmma"):
        tf32 = int(precision == "tf32")
        conv = {**base, "TF32": tf32, "KS": 3, "PAD": 1, "RELU": 1, "OUT_F32": 0}
        return [("conv", conv), ("conv split-K", {**conv, "SPLITK": 1}),
                ("fc last", {**base, "TF32": tf32, "KS": 1, "PAD": 0, "RELU": 0, "OUT_F32": 1})]
    if algo in ("tc_halo", "tc_halo_wgmma", "wgmma_halo"):
        conv = {**base, "TF32": int(precision == "tf32"), "RELU": 1, "OUT_F32": 0, "POOL": 0}
        return [("conv", conv)] + ([("conv POOL=1", {**conv, "POOL": 1})] if pools(algo, tiles) else [])
    conv = {**base, "RELU": 1}
    if algo == "tc_halo_sparse24" and pools(algo, tiles):
        return [("conv", {**conv, "POOL": 0}), ("conv POOL=1", {**conv, "POOL": 1})]
    return [("conv", conv)]


def shipped_configs() -> list[tuple[str, str, dict]]:
    """(algo, precision, tiles) of every tensor-core entry in the shipped tables, each once."""
    table = json.loads(shipped_file().read_text())
    seen, out = set(), []

    def add(algo, precision, params):
        if algo not in FILES:
            return
        tiles = {k: int(params[k]) for k in tunables(algo) if k in params}
        key = (algo, precision, tuple(sorted(tiles.items())))
        if key not in seen:
            seen.add(key)
            out.append((algo, precision, tiles))

    for device in table.values():
        for role, by_batch in device.items():
            if role.startswith("conv_by_batch_"):
                precision = role.rsplit("_", 1)[1]
                for shapes in by_batch.values():
                    for params in shapes.values():
                        add(params.get("ALGO", ""), precision, params)
            elif role == "sparse":
                for algo, params in by_batch.get("params", {}).items():
                    add(algo, "fp16", params)
    return out


def candidate_configs() -> list[tuple[str, str, dict]]:
    """Every registry candidate tile of the entries, at each precision the entry runs."""
    from vggserve.ops import eightbit_gemv, tensorcore, tensorcore_gemv, tensorcore_sparse, wgmma_halo

    lists = {"wgmma_halo": (wgmma_halo.TILES, wgmma_halo.valid),
             "tc_gemv8": (eightbit_gemv.TILES, eightbit_gemv.valid),
             "tc_gemv": (tensorcore_gemv.TILES, tensorcore_gemv.valid),
             "tc_gemm": (tensorcore.TILES, tensorcore.valid),
             "tc_wgmma": (tensorcore.WGMMA_TILES, tensorcore.wgmma_valid),
             "tc_halo": (tensorcore.HALO_TILES + tensorcore.HALO_FITTED_TILES, tensorcore.halo_valid),
             "tc_halo_wgmma": (tensorcore.HALO_WGMMA_TILES, tensorcore.halo_wgmma_valid),
             "tc_sparse24": (tensorcore_sparse.TILES, tensorcore_sparse.valid),
             "tc_halo_sparse24": (tensorcore_sparse.HALO_SPARSE_TILES, tensorcore_sparse.halo_valid)}
    out = []
    for algo, (tiles, valid) in lists.items():
        for tile in tiles:
            p = dict(zip(tunables(algo), tile))
            if valid(p):
                for precision in (("fp8", "int8") if algo == "tc_gemv8" else
                                  ("fp16", "tf32", "fp8", "int8") if algo in ("tc_gemm", "tc_halo", "wgmma_halo") else
                                  ("fp16", "tf32") if algo in DENSE_ALGOS else ("fp16",)):
                    out.append((algo, precision, p))
    return out


def clang_ptx(cl: Path, ptx: Path) -> subprocess.CompletedProcess:
    """OpenCL C 1.2 source -> PTX for sm_86 by clang-15 with libclc's NVPTX built-ins (see the module's text)."""
    return subprocess.run(["clang-15", "-x", "cl", "-cl-std=CL1.2", "-target", "nvptx64-nvidia-nvcl", "-march=sm_86",
                           "-Xclang", "-target-feature", "-Xclang", "+ptx75", "-Xclang", "-finclude-default-header",
                           "-Xclang", "-mlink-builtin-bitcode", "-Xclang", str(LIBCLC), "-O3", "-Dasm=__asm__",
                           "-Wno-everything", "-S", "-o", str(ptx), str(cl)], capture_output=True, text=True)


def as_sm90(text: str) -> str:
    """clang's PTX retargeted as NVIDIA's OpenCL emits it: PTX 8.0 (Hopper's) for sm_90; 8.4 where there is an e4m3
    mma.sync (NVIDIA's driver writes 9.0, issue 26's probe)."""
    text = re.sub(r"^\.version \S+", ".version 8.4" if ".e4m3" in text else ".version 8.0", text, flags=re.M)
    return re.sub(r"^\.target sm_86", ".target sm_90", text, flags=re.M)


def compile_report(source: str, kernel: str, work: Path) -> dict:
    """clang-15 -> PTX -> ptxas sm_90 -v: {"regs", "spill", "stack", "smem", "ptx", "cubin" (digests), "error"}.
    A source with wgmma placeholders (runtime/ptx.py) is patched as the runtime patches the driver's PTX and
    assembled for sm_90a; ptxas' warnings (e.g. wgmma serialised) are kept under "warnings"."""
    cl, ptx = work / "k.cl", work / "k.ptx"
    cl.write_text(source)
    r = clang_ptx(cl, ptx)
    if r.returncode:
        return {"error": "clang: " + " | ".join(x for x in r.stderr.splitlines() if "error" in x)[:300]}
    text = as_sm90(ptx.read_text())
    arch = "sm_90"
    if "SLOT_WG" in text:
        from vggserve.runtime import ptx as wgmma_ptx

        try:
            text, arch = wgmma_ptx.patch(text), "sm_90a"
        except wgmma_ptx.PtxPatchError as exc:
            return {"error": f"patch: {exc}"}
    ptx.write_text(text)
    body = "\n".join(line.split("//")[0].rstrip() for line in text.splitlines()
                     if line.strip() and not line.lstrip().startswith("//"))
    r = subprocess.run(["ptxas", f"-arch={arch}", "-v", str(ptx), "-o", str(work / "k.cubin")], capture_output=True,
                       text=True)
    log = r.stdout + r.stderr
    warnings = [x.strip() for x in log.splitlines() if "warning" in x.lower()]
    if r.returncode:
        return {"error": "ptxas: " + " | ".join(x for x in log.splitlines() if "error" in x.lower())[:300]}
    part = log.split(f"Function properties for {kernel}")[-1]
    num = lambda pattern: int(m.group(1)) if (m := re.search(pattern, part)) else 0  # noqa: E731 (absent: none)
    return {"regs": num(r"Used (\d+) registers"), "spill": num(r"(\d+) bytes spill stores") +
            num(r"(\d+) bytes spill loads"), "stack": num(r"(\d+) bytes stack frame"),
            "smem": num(r"(\d+) bytes smem"), "ptx": hashlib.sha256(body.encode()).hexdigest()[:12],
            "cubin": hashlib.sha256((work / "k.cubin").read_bytes()).hexdigest()[:12],
            **({"warnings": warnings} if warnings else {})}


def base_tree(rev: str, into: Path) -> Path:
    """kernels/ of git revision `rev`, written under `into`."""
    names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{rev}:kernels"], check=True,
                           capture_output=True, text=True).stdout.split()
    folder = into / "kernels"
    folder.mkdir(parents=True)
    for name in names:
        blob = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:kernels/{name}"], check=True,
                              capture_output=True).stdout
        (folder / name).write_bytes(blob)
    return folder


def fmt(r: dict | None) -> tuple:
    if r is None:
        return ("-",) * 4
    if "error" in r:
        return ("ERR",) * 4
    return (str(r["regs"]), str(r["spill"]), str(r["stack"]), str(r["smem"]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="main", help="git revision to compare with (default main; 'none': after only)")
    ap.add_argument("--candidates", action="store_true", help="also every registry candidate tile, not only the "
                    "shipped tables' ones")
    ap.add_argument("--only", action="append", choices=sorted(FILES), help="these kernels only (repeatable)")
    ap.add_argument("--precisions", default="", help="comma-separated: these precisions only (default: all)")
    ap.add_argument("--keep", type=Path, help="keep each program's source and PTX in this folder")
    args = ap.parse_args(argv)
    for tool in ("clang-15", "ptxas"):
        if shutil.which(tool) is None:
            sys.exit(f"ptx_check: {tool} not found (clang-15 from Debian, ptxas from the CUDA toolkit)")
    if not LIBCLC.exists():
        sys.exit(f"ptx_check: {LIBCLC} not found (Debian: apt-get install libclc-15)")
    configs = shipped_configs()
    if args.candidates:
        configs += [c for c in candidate_configs() if c not in configs]
    if args.only:
        configs = [c for c in configs if c[0] in args.only]
    if args.precisions:
        configs = [c for c in configs if c[1] in args.precisions.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base = None if args.base == "none" else base_tree(args.base, tmp / "base")
        head = ("kernel", "prec", "variant", "tiles", "regs", "spill", "stack", "smem", "ptx", "cubin")
        rows, changed, errors = [], 0, 0
        for algo, precision, tiles in configs:
            file, kernel = FILES[algo]
            for label, defines in variants(algo, precision, tiles):
                work = tmp / "work"
                work.mkdir(exist_ok=True)
                after = compile_report(kernel_source(file, defines), kernel, work)
                if args.keep:
                    stem = "_".join([algo, precision, label.replace(" ", "_").replace("=", "")] +
                                    [f"{k}{v}" for k, v in tiles.items()])
                    args.keep.mkdir(parents=True, exist_ok=True)
                    shutil.copy(work / "k.cl", args.keep / f"{stem}.cl")
                    if (work / "k.ptx").exists():
                        shutil.copy(work / "k.ptx", args.keep / f"{stem}.ptx")
                before = None
                if base is not None and (base / file).exists():
                    text = (base / file).read_text()
                    if "POOL" in defines and defines["POOL"] and "POOL" not in text:
                        before = None  # the base revision has no fused pooling here
                    elif any(defines.get(k) and k not in text for k in ("FP8", "OUT_FP8", "INT8", "OUT_INT8")):
                        before = None  # nor 8-bit
                    else:
                        before = compile_report(kernel_source(file, defines, folder=base), kernel, work)
                b, a = fmt(before), fmt(after)
                same = [x == y for x, y in zip(b, a)]
                ptx, cubin = ("-" if not before or key not in before or key not in after else
                              "same" if before[key] == after[key] else "differs" for key in ("ptx", "cubin"))
                errors += any("error" in r for r in (before or {}, after) if r)
                changed += before is not None and not all(same)
                cells = [f"{y}" if s or x == "-" else f"{x}->{y}" for x, y, s in zip(b, a, same)]
                if before is not None and all(same):
                    cells = [f"{y}" for y in a]
                tile = " ".join(f"{k}{v}" for k, v in tiles.items())
                rows.append((algo, precision, label, tile, *cells, ptx, cubin))
                for r in (before, after):
                    if r and "error" in r:
                        print(f"  {algo} {precision} {label} {tile}: {r['error']}", file=sys.stderr)
                    for warning in (r or {}).get("warnings", []):
                        print(f"  {algo} {precision} {label} {tile}: {warning}", file=sys.stderr)
        widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
        line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths))  # noqa: E731
        print(f"ptxas -arch=sm_90 -v (sm_90a for wgmma), before ({args.base}) -> after (this tree); a single figure: unchanged")
        print(line(head))
        print(line(["-" * w for w in widths]))
        for r in rows:
            print(line(r))
        print(f"{len(rows)} programs; {changed} with a changed register/spill/stack/smem figure; {errors} failed to "
              f"build")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
