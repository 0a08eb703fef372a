"""CPU per file of reading inputs whole: `vggserve.images.read_source` (how the batch job's CPU decoders and the
calibration read every input path) against the stream path it took before, on copies of one 500x375 JPEG; then
the same files read a group at a time, each group's bytes held until the group is read, as the batch job's device
decoder reads a decode group (--group files; 4 chunks of 64 by default): read_source's fresh bytes per file against
`vggserve.filearena.FileArena`, one reused buffer (what `decoding.device.decode_inputs` uses).

    python3 benchmarks/read_files.py                       # 2,000 copies of a 500x375 q90 JPEG in a temp dir
    python3 benchmarks/read_files.py --files 20000 --dir /dev/shm/reads

Prints microseconds of CPU and of wall time per file for each way, in turn, twice.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def stream_path(path) -> bytes:
    """The way read_source took before (and still takes for pipes): open_image's stream, a buffered file object
    checked by fstat and sized by seeking, then read()."""
    from vggserve.images import _binary_stream

    with _binary_stream(path) as (stream, _):
        return stream.read()


def main(argv=None) -> None:
    import numpy as np
    from PIL import Image

    from vggserve.filearena import FileArena
    from vggserve.images import read_source

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=2000)
    p.add_argument("--dir", default=None, help="where the copies go (default: a temp dir)")
    p.add_argument("--group", type=int, default=256, help="files per group in the grouped ways (default 256)")
    args = p.parse_args(argv)
    folder = Path(args.dir or tempfile.mkdtemp(prefix="vggserve-reads-"))
    folder.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()  # a photo's size: smooth colour and some noise, as batch_scaling.py's JPEGs
    ys, xs = np.mgrid[0:375, 0:500].astype(np.float32)
    rgb = np.stack([127 + 100 * np.sin(xs / (17 + 7 * c) + ys / (29 + 5 * c)) for c in range(3)], axis=2)
    rgb += np.random.default_rng(0).normal(0, 12, rgb.shape)
    Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
    paths = [folder / f"{i:06d}.jpg" for i in range(args.files)]
    for path in paths:
        path.write_bytes(buf.getvalue())
    print(f"{args.files} files of {len(buf.getvalue()):,} bytes in {folder}")
    groups = [paths[i:i + args.group] for i in range(0, len(paths), max(1, args.group))]
    arena = FileArena()
    ways = (("read_source", lambda: [read_source(q)[0] for q in paths]),
            ("the stream path (before)", lambda: [stream_path(q) for q in paths]),
            (f"read_source, {args.group} at a time", lambda: [[read_source(q)[0] for q in g] for g in groups]),
            (f"FileArena.read, {args.group} at a time", lambda: [arena.read(g) for g in groups]))
    for _ in range(2):
        for name, read in ways:
            cpu, wall = time.process_time(), time.perf_counter()
            read()
            n = len(paths)
            print(f"{name}: {(time.process_time() - cpu) / n * 1e6:.1f} us CPU, "
                  f"{(time.perf_counter() - wall) / n * 1e6:.1f} us wall per file", flush=True)


if __name__ == "__main__":
    main()
