"""How much of the time each engine process holds its GIL under load, and in what: py-spy, sampling only the threads
that hold the GIL (`py-spy record --gil --nonblocking`), beside a measured window.

    sampler = GilSampler.start(engine_pids(server_pid, tree), seconds=3)
    ...                                                              # the load goes on meanwhile
    sampler.result()   # [{"pid": P, "held": 0.57, "threads": ..., "top": [["decode_for_model", 0.48], ...]}
                       #  or {"pid": P, "error": "..."}, the server's first; where py-spy is not on PATH, one
                       #  record saying so]

An engine process is the server's own (engine 0) and each `vggserve.serving.processes.engine_process` below it
(`--engine-processes per-device`). Held near 1.0 is a process bound by its GIL; `top` gives each function's share of
the window (inclusive: the samples whose stack holds it, over all the samples the window could hold). py-spy must
be allowed to read other processes (root, or CAP_SYS_PTRACE); where it is not, the error says py-spy's reason.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

RATE = 250  # samples per second
ENGINE_MODULE = "vggserve.serving.processes.engine_process"


def engine_pids(server_pid: int, tree, proc: str = "/proc") -> list[int]:
    """The server process and the engine processes of its process tree `tree` (pids; serve_saturation's
    process_tree_cpu reads it), those whose command line names ENGINE_MODULE, in pid order after the server's."""
    def engine(pid: int) -> bool:
        try:
            return ENGINE_MODULE.encode() in (Path(proc) / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:  # gone meanwhile
            return False

    return [server_pid] + sorted(pid for pid in tree if pid != server_pid and engine(pid))


def held(raw: str, seconds: float, rate: int = RATE, top: int = 8) -> dict:
    """A py-spy raw recording (collapsed stacks, each led by its thread: `--threads`) of the GIL holders over
    `seconds` at `rate`: the share of the window some thread held the GIL ("held"), each thread's share by name
    ("threads"), and the `top` functions by their inclusive share ("top": a function counted once per sample however
    often it recurs; the frames that wrap nearly all of their threads' samples, a thread's run loop, left out)."""
    window = max(1.0, seconds * rate)
    total, threads, functions, within = 0, Counter(), Counter(), {}
    for line in raw.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        thread, *frames = stack.split(";")
        name = thread.split(": ", 1)[-1].strip() if thread.startswith("thread") else "?"
        total += n
        threads[name] += n
        for function in dict.fromkeys(frame.split(" (")[0] for frame in frames):  # once each, outermost first
            functions[function] += n
            within.setdefault(function, set()).add(name)
    wrappers = {f for f, n in functions.items() if n >= 0.9 * sum(threads[t] for t in within[f])}
    return {"held": total / window,
            "threads": [[name, n / window] for name, n in threads.most_common()],
            "top": [[f, n / window] for f, n in functions.most_common() if f not in wrappers][:top]}


class GilSampler:
    """py-spy recording the GIL holders of each of `pids` for `seconds` (whole seconds, at least 1: py-spy's), in the
    background."""

    def __init__(self, binary: str | None, pids: list[int], seconds: float, rate: int = RATE):
        self.seconds, self.rate = max(1, round(seconds)), rate
        self._missing = None if binary else {"pid": pids[0], "error": "py-spy is not on PATH (pip install py-spy)"}
        self._dir = tempfile.TemporaryDirectory(prefix="vggserve-gil-")
        self._runs = {}
        for pid in pids if binary else ():
            out = Path(self._dir.name) / f"{pid}.txt"
            command = [binary, "record", "--pid", str(pid), "--duration", str(self.seconds), "--rate",
                       str(rate), "--gil", "--threads", "--nonblocking", "--format", "raw", "--output", str(out)]
            self._runs[pid] = (subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True),
                               out)

    @classmethod
    def start(cls, pids: list[int], seconds: float, binary: str | None = None, rate: int = RATE) -> "GilSampler":
        """A sampler of `pids` with py-spy (`binary`, else py-spy on PATH); where there is none, its result says
        so."""
        return cls(binary or shutil.which("py-spy"), pids, seconds, rate)

    def result(self) -> list[dict]:
        """[{"pid": pid, held()'s figures, or "error": py-spy's last line}, ...] in the order of `pids`, once every
        recording has ended."""
        results = [self._missing] if self._missing else []
        for pid, (proc, out) in self._runs.items():
            try:
                _, err = proc.communicate(timeout=self.seconds + 60)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            if proc.returncode == 0 and out.exists():
                results.append({"pid": pid, **held(out.read_text(), self.seconds, self.rate)})
            else:
                lines = [line.strip() for line in (err or "").splitlines() if line.strip()]
                results.append({"pid": pid,
                                "error": lines[-1] if lines else f"py-spy exited with status {proc.returncode}"})
        self._dir.cleanup()
        return results


def summary(results: list[dict], threads: int = 2, top: int = 3) -> str:
    """One line: each engine process's GIL share (GilSampler.result's records, in order), its busiest threads and
    functions there, or why it was not measured."""
    parts = []
    for index, r in enumerate(results):
        if "error" in r:
            parts.append(f"engine {index} not measured ({r['error']})")
            continue
        busiest = ", ".join(f"{name} {share:.0%}" for name, share in r["threads"][:threads])
        inside = ", ".join(f"{name} {share:.0%}" for name, share in r["top"][:top])
        parts.append(f"engine {index} {r['held']:.0%}" + (f" (threads: {busiest}" if busiest else "") +
                     (f"; in {inside}" if inside else "") + (")" if busiest else ""))
    return "; ".join(parts)
