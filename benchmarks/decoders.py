"""JPEG/PNG decoders per image on the realistic mix, and whether each gives Pillow's pixels bit for bit.

    python benchmarks/decoders.py                                   # Pillow, simplejpeg, PyTurboJPEG where installed
    python benchmarks/decoders.py --simd-python /tmp/simd/bin/python  # also pillow-simd, installed in another venv

1. Writes the mix of vggserve.decoding.corpus (500x375 JPEGs, 1-2 MP thumbnails, 12 MP photos, progressive, 4:4:4,
   4:2:2, PNG, gray, CMYK) into --workdir (once).
2. Times each decoder on each file, bytes in memory -> uint8 RGB array (no EXIF turn), on one thread: the median of
   --repeats calls after one untimed call. Pillow is the reference: `Image.open(...).convert("RGB")` as vggserve's
   exact mode decodes; every other decoder's array is compared with it byte for byte ("same" column).
   pillow-simd replaces Pillow in its environment, so it runs in --simd-python (a venv where `pip install
   pillow-simd` built it) and reports hashes of its arrays.
3. Times vggserve's own decode step (`decoding.model_input`: bytes -> the model input of a device that resizes) in
   the exact and the fast mode, and prints the fast mode's speed-up on the 12 MP photos (target >= 4x).
Prints Markdown tables (for BENCHMARKS.md); --json FILE writes the numbers.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default=None, help="where the corpus is written (default: a temporary folder)")
    p.add_argument("--repeats", type=int, default=7, help="timed calls per file and decoder (default 7)")
    p.add_argument("--simd-python", default=None, help="python of an environment with pillow-simd installed")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--pillow-only", default=None, metavar="DIR", help=argparse.SUPPRESS)  # the pillow-simd side
    return p.parse_args(argv)


def timed(call, repeats: int) -> tuple[float, object]:
    """(median seconds per call, the last result), after one untimed call."""
    result = call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def pillow_rgb(data: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        image.load()
        return np.asarray(image if image.mode == "RGB" else image.convert("RGB"))


def decoders() -> dict:
    """{name: bytes -> RGB array, or None where it does not install or cannot start}."""
    found = {"Pillow": pillow_rgb}
    try:
        import simplejpeg

        found["simplejpeg"] = lambda data: simplejpeg.decode_jpeg(data, "RGB", strict=True)
    except ImportError:
        found["simplejpeg"] = None
    try:
        import turbojpeg

        tj = turbojpeg.TurboJPEG()
        found["PyTurboJPEG"] = lambda data: tj.decode(data, pixel_format=turbojpeg.TJPF_RGB)
    except (ImportError, RuntimeError, OSError):
        found["PyTurboJPEG"] = None
    return found


def digest(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes() + str(array.shape).encode()).hexdigest()


def pillow_side(folder: str, repeats: int) -> int:
    """In the pillow-simd environment: {file: [seconds, hash]} as JSON on stdout."""
    import PIL

    out = {"version": PIL.__version__}
    for path in sorted(Path(folder).iterdir()):
        data = path.read_bytes()
        seconds, array = timed(lambda: pillow_rgb(data), repeats)
        out[path.name] = [seconds, digest(array)]
    print(json.dumps(out))
    return 0


def measure_decoders(files: dict, repeats: int, simd_python: str | None) -> dict:
    rows = {}
    found = decoders()
    for name, path in files.items():
        data = Path(path).read_bytes()
        reference = pillow_rgb(data)
        row = {"kbytes": len(data) // 1000, "size": f"{reference.shape[1]}x{reference.shape[0]}"}
        for decoder, call in found.items():
            if call is None:
                row[decoder] = None
                continue
            try:
                seconds, array = timed(lambda: call(data), repeats)
            except Exception as exc:  # noqa: BLE001 - a decoder that cannot read this file: say so
                row[decoder] = {"error": type(exc).__name__}
                continue
            row[decoder] = {"ms": 1000 * seconds, "same": bool(np.array_equal(array, reference))}
        rows[name] = row
    if simd_python:
        simd = subprocess.run([simd_python, __file__, "--pillow-only", str(Path(next(iter(files.values()))).parent),
                               "--repeats", str(repeats)], capture_output=True, text=True, timeout=3600)
        if simd.returncode == 0:
            answers = json.loads(simd.stdout)
            for name, path in files.items():
                seconds, hashed = answers[Path(path).name]
                same = hashed == digest(pillow_rgb(Path(path).read_bytes()))
                rows[name]["pillow-simd"] = {"ms": 1000 * seconds, "same": same, "version": answers["version"]}
        else:
            print(f"decoders: pillow-simd run failed: {simd.stderr.strip()[-300:]}", file=sys.stderr)
    return rows


def measure_modes(files: dict, repeats: int) -> dict:
    """vggserve's decode step, exact and fast, and exact with every JPEG left to Pillow (the decode step before
    simplejpeg was adopted): ms per image for a device that resizes (RawImage or crop)."""
    sys.path.insert(0, str(REPO))
    from vggserve.decoding import jpeg, model_input

    rows = {}
    for name, path in files.items():
        data = Path(path).read_bytes()
        rows[name] = {mode: 1000 * timed(lambda: model_input(data, "torchvision", True, mode), repeats)[0]
                      for mode in ("exact", "fast")}
        adopted, jpeg._adopted = jpeg.adopted(), False
        try:
            rows[name]["pillow"] = 1000 * timed(lambda: model_input(data, "torchvision", True), repeats)[0]
        finally:
            jpeg._adopted = adopted
    return rows


def decoder_table(rows: dict) -> str:
    names = [n for n in ("Pillow", "simplejpeg", "PyTurboJPEG", "pillow-simd") if any(r.get(n) for r in rows.values())]
    head = "| file | size | KB | " + " | ".join(f"{n} ms" for n in names) + " |"
    lines = [head, "|" + "---|" * 3 + "---:|" * len(names)]
    for file, row in rows.items():
        cells = []
        for n in names:
            cell = row.get(n)
            if cell is None:
                cells.append("n/a")
            elif "error" in cell:
                cells.append(f"refuses ({cell['error']})")
            else:
                mark = "" if n == "Pillow" else (" same" if cell["same"] else " **differs**")
                cells.append(f"{cell['ms']:.2f}{mark}")
        lines.append(f"| {file} | {row['size']} | {row['kbytes']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def mode_table(rows: dict) -> str:
    lines = ["| file | exact, Pillow only ms | exact ms | fast ms | fast / exact | fast / Pillow only |",
             "|---|---:|---:|---:|---:|---:|"]
    for file, row in rows.items():
        lines.append(f"| {file} | {row['pillow']:.2f} | {row['exact']:.2f} | {row['fast']:.2f} | "
                     f"{row['exact'] / row['fast']:.2f}x | {row['pillow'] / row['fast']:.2f}x |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.pillow_only:
        return pillow_side(args.pillow_only, args.repeats)
    sys.path.insert(0, str(REPO))
    from PIL import Image, features

    from vggserve.decoding.corpus import write_mix

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="vggserve-decoders-"))
    files = write_mix(workdir / "mix")
    print(f"decoders: {len(files)} files in {workdir / 'mix'}; Pillow {Image.__version__} (libjpeg-turbo "
          f"{features.version('libjpeg_turbo')}), one thread, median of {args.repeats}", file=sys.stderr)
    rows = measure_decoders(files, args.repeats, args.simd_python)
    print("\nDecoders, bytes -> RGB array (ms per image; 'same': bit-identical to Pillow)\n")
    print(decoder_table(rows))
    modes = measure_modes(files, args.repeats)
    print("\nvggserve's decode step, bytes -> model input for a device that resizes (ms per image)\n")
    print(mode_table(modes))
    big = [row for name, row in modes.items() if name.startswith("photo_12mp")]
    mean = {mode: sum(r[mode] for r in big) / len(big) for mode in ("pillow", "exact", "fast")}
    speedup = mean["exact"] / mean["fast"]
    print(f"\n12 MP photos (one upright, one turned), mean: exact {mean['exact']:.1f} ms, fast {mean['fast']:.1f} ms "
          f"per image: fast decodes {speedup:.2f}x as many as exact (target >= 4x), "
          f"{mean['pillow'] / mean['fast']:.2f}x as many as the Pillow-only exact step ({mean['pillow']:.1f} ms)")
    if args.json:
        Path(args.json).write_text(json.dumps({"decoders": rows, "modes": modes, "fast_speedup_12mp": speedup},
                                              indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
