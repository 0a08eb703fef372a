"""Kernel sources and compiled programs, with an on-disk binary cache.

Sources live in the top-level `kernels/` folder (shipped inside the wheel as `vggserve/_kernels`). A program is
source + `#define` lines; its binary is cached under the user cache dir, keyed by device name, driver version,
platform version and the full source text, so a second start does not compile. `VGGSERVE_NO_PROGRAM_CACHE=1`
turns the cache off. A cached file is the binary behind a header with its length and sha256: one that does not
match (truncated, altered) is rebuilt from source, because a driver given a damaged binary may crash (PoCL does).

Where the driver keeps what it compiles in a cache of its own (PoCL, unless POCL_KERNEL_CACHE=0), the cached file
is only a note that the program was built (its source's sha256), and a hit builds from source, which that cache
answers. Asking PoCL for a binary makes it compile every kernel of the program once more, for any work-group size,
beside the compile for the size it is launched with (cold, two emulated wgmma layer tests took 45.7 s with the
binaries and 15.7 s without), for a binary its own cache makes unnecessary (`ProgramCache(binaries=True)` keeps
binaries anyway).

A generated program (weights compiled into the code, conv_sparse_codegen.cl) is a template file that includes a
piece the host writes (`Generated`); its binary is keyed by the template and a digest of what the piece is made
from (the weights' hash), so a cached binary is found without writing the piece again.
"""

import hashlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pyopencl as cl
from platformdirs import user_cache_dir

from ..errors import KernelBuildError
from ..tempfiles import replace_atomically
from .binaries import program_binary
from .buildprogress import BuildProgress

_HERE = Path(__file__).resolve().parent.parent
MAGIC = b"vggserve-program-1\n"  # then the binary's sha256 (32 bytes), then the binary
BUILT = b"vggserve-built-by-driver-1\n"  # then the source's sha256 (32 bytes): the driver's cache holds the program


def kernels_dir() -> Path:
    for candidate in (_HERE / "_kernels", _HERE.parent / "kernels"):
        if candidate.is_dir():
            return candidate
    raise KernelBuildError(f"kernel sources not found (looked in {_HERE / '_kernels'} and {_HERE.parent / 'kernels'})")


INCLUDE = re.compile(r'^#include "([\w.]+)"[^\n]*$', re.MULTILINE)


@dataclass(frozen=True)
class Generated:
    """A piece of source the host writes, included by a template as `#include "<name>"`.

    key: a digest of everything the text depends on (e.g. the weights' sha256 and the grouping); make(): the text,
    called only when no cached binary has this key."""

    name: str
    key: str
    make: Callable[[], str]


def kernel_source(name: str, defines: dict, generated: dict[str, str] | None = None, folder: Path | None = None) -> str:
    """The `#define`s, then the file with each `#include "x"` replaced by `generated[x]` if given, else by the text
    of kernels/x, itself expanded the same way (so the program cache key covers included files, and no compiler
    include path is needed). folder: where the sources are (default `kernels_dir()`; benchmarks/ptx_check.py
    compiles another revision's)."""
    pieces = generated or {}
    root = Path(folder) if folder is not None else kernels_dir()

    def expand(text: str, seen: tuple) -> str:
        def included(m):
            if m.group(1) in pieces:
                return pieces[m.group(1)]
            if m.group(1) in seen:
                raise KernelBuildError(f"kernel source {m.group(1)} includes itself ({' -> '.join(seen)})")
            return expand((root / m.group(1)).read_text(), seen + (m.group(1),))

        return INCLUDE.sub(included, text)

    body = expand((root / name).read_text(), (name,))
    head = "".join(f"#define {k} {int(v)}\n" for k, v in sorted(defines.items()))
    return head + body


def cache_dir() -> Path:
    return Path(os.environ.get("VGGSERVE_CACHE_DIR") or user_cache_dir("vggserve")) / "programs"


def driver_caches_programs(device) -> bool:
    """Whether the device's driver keeps compiled programs in a cache of its own, keyed by their source and options
    (PoCL's kernel cache, on unless POCL_KERNEL_CACHE=0; POCL_CACHE_DIR says where, default ~/.cache/pocl)."""
    return "Portable Computing Language" in device.platform.name and os.environ.get("POCL_KERNEL_CACHE", "1") != "0"


def cache_key(device, source: str, options: str) -> str:
    h = hashlib.sha256()
    for part in (device.name, device.driver_version, device.platform.version, options, source):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


class ProgramCache:
    """Builds programs for one context/device, reusing cached binaries; counts hits and compiles."""

    def __init__(self, context, device, options: str = "-cl-mad-enable", folder: Path | None = None,
                 progress: bool = True, binaries: bool | None = None):
        """folder: where binaries are kept (default: `cache_dir()`, read when the cache is made).
        progress: report compiles that take long (runtime/buildprogress.py); the owner calls `finish` when its
        start-up's builds are over. binaries: keep each program's binary (default: unless the driver caches programs
        itself, `driver_caches_programs`; a generated or PTX-patched program's binary is kept either way)."""
        self.context, self.device, self.options = context, device, options
        self.binaries = not driver_caches_programs(device) if binaries is None else binaries
        self.folder = Path(folder) if folder is not None else cache_dir()
        self.enabled = os.environ.get("VGGSERVE_NO_PROGRAM_CACHE", "") not in ("1", "true", "yes")
        self.hits = self.compiles = 0
        self.seconds = 0.0
        self._built: dict = {}  # (name, defines) -> program, so layers sharing parameters share one program
        self.progress = BuildProgress(device.name.strip(), self.folder) if progress else None

    def build(self, name: str, defines: dict, generated: Generated | None = None, ptx=None):
        """The program of kernels/`name` with `defines`, and with `generated` included where the template says.
        ptx: a module with `patch(text) -> text` and `PATCH_VERSION` (runtime/ptx.py): the program is built from the
        driver's PTX so patched."""
        memo = (name, tuple(sorted(defines.items())), generated and (generated.name, generated.key),
                ptx and ptx.PATCH_VERSION)
        if memo in self._built:
            return self._built[memo]
        t0 = time.perf_counter()
        if generated is None:
            source = kernel_source(name, defines)
            key = cache_key(self.device, source, self.options + (f" [{ptx.PATCH_VERSION}]" if ptx else ""))
        else:  # keyed by the template and the piece's digest; the piece itself is written only on a miss
            source = None
            template = kernel_source(name, defines, {generated.name: f"/* {generated.name}: {generated.key} */"})
            key = cache_key(self.device, template, self.options)
        path = self.folder / f"{key}.bin"
        program = self._from_cache(name, path, source) if self.enabled else None
        if program is None:
            program = self._compile_and_store(name, defines, source, generated, path, ptx)
            self.compiles += 1
        else:
            self.hits += 1
        self.seconds += time.perf_counter() - t0
        self._built[memo] = program
        return program

    def finish(self) -> None:
        """The builds of a start are over: a long run of compiles is summed up (`BuildProgress.finish`)."""
        if self.progress is not None:
            self.progress.finish()

    def _compile_and_store(self, name: str, defines: dict, source: str | None, generated: Generated | None,
                           path: Path, ptx=None):
        """The miss, reported as one compile: the piece written, the build, and the binary stored (PoCL makes
        the machine code only when asked for the binary: that is most of a CPU's time)."""
        if self.progress is not None:
            self.progress.compiling(name)
        try:
            if source is None:
                source = kernel_source(name, defines, {generated.name: generated.make()})
            program = self._compile(name, source)
            if ptx is not None:
                program = self._patched(name, program, ptx)
            if self.enabled and (self.binaries or generated is not None or ptx is not None):
                self._store(path, program)
            elif self.enabled:
                self._note_built(path, source)
            return program
        finally:
            if self.progress is not None:
                self.progress.compiled()

    def _from_cache(self, name: str, path: Path, source: str | None):
        """The cached program: from its binary, or built from `source` where the file notes that the driver's own
        cache holds it; None when there is no usable entry."""
        try:
            data = path.read_bytes()
        except OSError:
            return None
        if data.startswith(BUILT):
            if source is None or data[len(BUILT):] != hashlib.sha256(source.encode()).digest():
                return None
            return self._compile(name, source)
        head = len(MAGIC) + 32
        binary = data[head:]
        if not data.startswith(MAGIC) or not binary or hashlib.sha256(binary).digest() != data[len(MAGIC):head]:
            return None  # damaged, or written by another version: never give the driver a binary it may crash on
        try:
            return cl.Program(self.context, [self.device], [binary]).build(options=self.options)
        except cl.Error:
            return None  # stale or foreign binary: rebuild from source

    def _compile(self, name: str, source: str):
        try:
            return cl.Program(self.context, source).build(options=self.options, devices=[self.device])
        except cl.RuntimeError as exc:
            log = str(exc).strip().splitlines()
            detail = " | ".join(line for line in log if "error" in line.lower())[:1500] or " ".join(log)[:1500]
            raise KernelBuildError(f"building kernels/{name} for {self.device.name.strip()} failed: {detail}") from exc

    def _patched(self, name: str, program, ptx):
        """The program built again from its PTX, patched (runtime/ptx.py)."""
        what = f"the PTX program of kernels/{name} for {self.device.name.strip()}"
        try:
            text = program_binary(program).rstrip(b"\0").decode()
            patched = ptx.patch(text)
        except (UnicodeDecodeError, ptx.PtxPatchError) as exc:
            raise KernelBuildError(f"patching {what} failed: {exc}") from exc
        try:
            return cl.Program(self.context, [self.device], [patched.encode() + b"\0"]).build(options=self.options)
        except cl.Error as exc:
            log = " ".join(str(exc).split())[:1500]
            raise KernelBuildError(f"building {what} failed: {log}") from exc

    def _note_built(self, path: Path, source: str) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            replace_atomically(path, BUILT + hashlib.sha256(source.encode()).digest())
        except OSError:
            pass  # as _store

    def _store(self, path: Path, program) -> None:
        try:
            binary = program_binary(program)  # minutes on PoCL for big programs: without the GIL
            path.parent.mkdir(parents=True, exist_ok=True)
            replace_atomically(path, MAGIC + hashlib.sha256(binary).digest() + binary)
        except (OSError, cl.Error):
            pass  # a cache that cannot be written only costs a compile next time
