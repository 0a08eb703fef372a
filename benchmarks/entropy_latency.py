"""The parallel entropy decoder's synchronisation kernel (`jpeg_sync` in kernels/jpeg_entropy.cl), timed on chunks
alone: what one chunk's serial decode costs, which is what each late synchronisation round costs.

    python3 benchmarks/entropy_latency.py --device gpu                          # this tree's kernel
    python3 benchmarks/entropy_latency.py --device gpu --against main           # and another revision's (or a file's;
                                                                                # repeatable)
    python3 benchmarks/entropy_latency.py --device gpu --local-tables           # plus a variant: tables in local memory

One batch of 500x375 q90 4:2:0 JPEGs (device_decode.py's corpus) is laid out as the decoder does, in chunks of 128
bytes; `jpeg_sync`'s round 0 then runs on all chunks (lookback 128 and 0 bytes), on one chunk alone (lookback 0: one
work-item decoding 128 bytes, the latency of a late round; 24 chunks, the median), on 32 chunks in one warp, on one
chunk in all 32 lanes of a warp (no divergence: what 32 different chunks cost past it is their lanes' paths and
addresses apart), and on 528 chunks (every 17th, 64 to a work-group). Each variant's exits after round 0 are compared
with the first's. Symbols per chunk are counted on the same batch by an instrumented copy of the kernel (one symbol at
a time). This tree's kernel runs twice:
with its multi-symbol tables (`jpeg_multi`, several plain AC symbols a step) and one symbol at a time.

`--local-tables` copies the Huffman tables of each work-group's first chunk into local memory and decodes every chunk
of the work-group with them: right only where every file has the same tables (this corpus: Pillow's at q90), which
the comparison of the exits checks.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))


def _function(src: str, start: str) -> str:
    i = src.index(start)
    return src[i:src.index("\n}\n", i) + 3]


def local_tables(src: str) -> tuple[str, str]:
    """(source, kernel name) of the variant whose rounds read the work-group's first chunk's tables from local
    memory: je_code, je_run and jpeg_sync copied with their table pointers in __local."""
    sym = _function(src, "inline int je_code(").replace("je_code(", "je_code_l(").replace(
        "__global const int *t", "__local const int *t")
    run = _function(src, "inline int je_run(").replace("je_run(", "je_run_l(").replace("je_code(", "je_code_l(")
    for name in ("*tab", "*tdc = tab", "*t = dc"):
        run = run.replace(f"__global const int {name}", f"__local const int {name}")
    sync = _function(src, "__kernel void jpeg_sync(").replace("jpeg_sync(", "jpeg_sync_l(").replace("je_run(",
                                                                                                    "je_run_l(")
    load = """
    __local int lt[4 * JH_TAB];
    {
        const int j0 = min((int)(get_group_id(0) * get_local_size(0)), nchunks - 1);
        __global const int *s0 = meta + seg_at + chunk[j0 * JE_CHUNK_INTS] * JH_SEG;
        __global const int *c0 = meta + comp_at + (meta + img_at + s0[0] * JH_IMG)[2] * JH_COMP;
        const int ids[4] = {c0[4], c0[5], c0[JH_COMP + 4], c0[JH_COMP + 5]};
        for (int i = get_local_id(0); i < 4 * JH_TAB; i += get_local_size(0))
            lt[i] = meta[tab_at + ids[i / JH_TAB] * JH_TAB + i % JH_TAB];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const int j = get_global_id(0);"""
    sync = sync.replace("\n    const int j = get_global_id(0);", load, 1).replace(
        "je_mcu_init(&m, comp + im[2] * JH_COMP, im[1]);",
        "je_mcu_init(&m, comp + im[2] * JH_COMP, im[1]); m.dc0 = 0; m.ac0 = 1; m.dc1 = m.dc2 = 2; m.ac1 = m.ac2 = 3;")
    sync = sync.replace("je_run_l(data, s[2], tab,", "je_run_l(data, s[2], lt,")
    if sync.count("je_run_l(data, s[2], lt,") != 2:
        raise SystemExit("--local-tables: jpeg_sync no longer has the shape this variant rewrites")
    return src + "\n" + sym + "\n" + run + "\n" + sync, "jpeg_sync_l"


def counting(src: str) -> str:
    """The kernel with je_run's loop iterations (one per symbol) written where a chunk's exit keeps its blocks."""
    src = src.replace("    while (p < stop) {\n", "    int symbols = 0;\n    while (p < stop) {\n        ++symbols;\n", 1)
    return src.replace("    *pos = p >> 3;\n    *bit = p & 7;\n    return 0;\n}",
                       "    *pos = p >> 3;\n    *bit = p & 7;\n    *blocks = symbols;\n    return 0;\n}", 1)


def main(argv=None) -> int:
    import pyopencl as cl

    from device_decode import corpus
    from vggserve.decoding.device import Window, prepare
    from vggserve.decoding.device.decoder import lay_out
    from vggserve.decoding.device.tables import TAB
    from vggserve.runtime import devices as devs

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--files", type=int, default=64, help="JPEGs in the batch (default 64)")
    ap.add_argument("--against", metavar="REV", action="append", default=[],
                    help="also time jpeg_entropy.cl of this git revision (or this file), first (repeatable)")
    ap.add_argument("--local-tables", action="store_true", help="also time the local-memory tables variant")
    args = ap.parse_args(argv)

    root = HERE.parent
    tree = (root / "kernels" / "jpeg_entropy.cl").read_text()
    variants = {"this tree": (tree, "jpeg_sync"), "this tree, one symbol at a time": (tree, "jpeg_sync")}
    others = {}
    for against in args.against:
        if Path(against).is_file():
            others[against] = (Path(against).read_text(), "jpeg_sync")
        else:
            others[against] = (subprocess.run(["git", "-C", str(root), "show", f"{against}:kernels/jpeg_entropy.cl"],
                                              capture_output=True, text=True, check=True).stdout, "jpeg_sync")
    variants = {**others, **variants}
    if args.local_tables:
        variants["local tables"] = local_tables(tree)

    dev = devs.cl_device(devs.resolve(args.device))
    ctx = cl.Context([dev])
    queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    prepared = [prepare(f) for f in corpus(args.files, 500, 375, 90)]
    windows, offset = [], 0
    for p in prepared:
        windows.append(Window.whole(p, offset))
        offset += p.size[0] * p.size[1] * 3
    batch, meta, at, _ = lay_out(prepared, windows, 128,
                                 lambda role, nbytes, dtype=np.uint8: np.zeros(nbytes, np.uint8).view(dtype))
    chunk = np.ascontiguousarray(batch.chunk, np.int32)
    n = chunk.shape[0]
    mf = cl.mem_flags
    data_buf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(batch.data))
    meta_buf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=meta)
    states = [cl.Buffer(ctx, mf.READ_WRITE, n * 32) for _ in range(2)]
    used = cl.Buffer(ctx, mf.READ_WRITE, n * 16)
    settled = cl.Buffer(ctx, mf.READ_WRITE, 4 * batch.seg.shape[0])
    options = "-cl-mad-enable -I " + str(root / "kernels")

    ntab = batch.tab.size // TAB
    checkpoints = cl.Buffer(ctx, mf.READ_WRITE, n * 16 * 6 * 4)  # a kernel's checkpoints (up to 16 a chunk)
    changed = cl.Buffer(ctx, mf.READ_WRITE, 4 * 20)  # the rounds' flags (jpeg_sync's last argument)

    def multi_tables(program, src: str):
        """This batch's multi-symbol tables as `program` (built from `src`) builds them, its JE_MULTI bits each (None
        for a kernel without them)."""
        found = re.search(r"#define JE_MULTI (\d+)", src)
        if not found:
            return None
        entries = ntab << int(found.group(1))
        out = cl.Buffer(ctx, mf.READ_WRITE, 4 * entries)
        build = cl.Kernel(program, "jpeg_multi")
        build.set_args(meta_buf, np.int32(at[3]), np.int32(ntab), out)
        cl.enqueue_nd_range_kernel(queue, build, (entries,), None).wait()
        return out

    def launch(kernel, sub: np.ndarray, lookback: int, repeats: int = 9, multi=None, multi_on: int = 1) -> float:
        """Median microseconds of round 0 over the chunks `sub` (a kernel with the multi-symbol arguments gets
        `multi`, used where multi_on)."""
        chunk_buf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(sub))
        m = sub.shape[0]
        extra = (multi, np.int32(multi_on), checkpoints, np.int32(0), np.int32(0), changed)[:kernel.num_args - 15]
        # the arguments this kernel has (round 0 never resumes, nor reads or writes the rounds' flags)
        kernel.set_args(data_buf, meta_buf, *(np.int32(a) for a in at[:4]), chunk_buf, np.int32(m), states[0],
                        states[1], used, settled, np.int32(0), np.int32(19), np.int32(lookback), *extra)
        times = []
        for _ in range(repeats):
            event = cl.enqueue_nd_range_kernel(queue, kernel, (-(-m // 64) * 64,), (64,))
            event.wait()
            times.append((event.profile.end - event.profile.start) * 1e-3)
        return float(np.median(times))

    counting_program = cl.Program(ctx, counting(tree)).build(options=options)
    launch(cl.Kernel(counting_program, "jpeg_sync"), chunk, 0, repeats=1, multi=multi_tables(counting_program, tree),
           multi_on=0)
    exits = np.empty((n, 8), np.int32)
    cl.enqueue_copy(queue, exits, states[1])
    print(f"{dev.name.strip()}: {len(prepared)} JPEGs, {n} chunks of 128 bytes, {exits[:, 3].mean():.0f} symbols a "
          f"chunk (decoded from its start)", flush=True)
    firsts = set(batch.seg[:, 6].tolist())
    alone = [j for j in np.random.default_rng(0).permutation(n).tolist() if j not in firsts][:24]
    reference = None
    for name, (src, kernel_name) in variants.items():
        program = cl.Program(ctx, src).build(options=options)
        kernel = cl.Kernel(program, kernel_name)
        way = {"multi": multi_tables(program, src), "multi_on": int(not name.endswith("one symbol at a time"))}
        every = launch(kernel, chunk, 128, **way)
        cl.enqueue_copy(queue, exits, states[1])
        reference = exits.copy() if reference is None else reference
        agree = np.array_equal(exits, reference)
        every0 = launch(kernel, chunk, 0, **way)
        one = [launch(kernel, chunk[j:j + 1], 0, repeats=5, **way) for j in alone]
        warp = [launch(kernel, chunk[j:j + 32], 0, repeats=5, **way) for j in alone[:8]]
        spread = launch(kernel, chunk[::17][:528], 0, **way)
        # the same chunk in every lane of a warp: the same path and the same addresses, so what 32 different chunks
        # cost past this is their lanes' divergence
        same = [launch(kernel, np.ascontiguousarray(np.repeat(chunk[j:j + 1], 32, 0)), 0, repeats=5, **way)
                for j in alone[:8]]
        print(f"{name}: round 0, every chunk: {every:.1f} us (lookback 128), {every0:.1f} us (lookback 0); one chunk "
              f"alone: median {np.median(one):.1f} us (range {min(one):.1f}-{max(one):.1f}); 32 chunks in one warp "
              f"{np.median(warp):.1f} us; one chunk in all 32 lanes of a warp {np.median(same):.1f} us; 528 chunks "
              f"(every 17th) {spread:.1f} us; exits as the first: {agree}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
