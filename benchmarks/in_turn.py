"""Variants of one measurement, run in turn round after round, with medians: for machines whose speed drifts.

On the shared GPU hosts one run of a command moves 10-30% from run to run, and a call's machine can speed up or slow
down from its first minute to its last (BENCHMARKS.md, thirty-first and thirty-second sessions). A comparison is
then only worth the runs taken back to back: each round runs every variant once, the order reversed every other
round (A, B, C; C, B, A; ...) so that a drift over the call cancels out of the medians, and each variant is compared
with the first one within each round as well as by the medians.

    python3 benchmarks/in_turn.py --rounds 3 --pattern 'service\\s*:\\s*([\\d,.]+) images/s' \\
        --run old='cd /tmp/old && python3 benchmarks/serve_saturation.py ... ' \\
        --run new='python3 benchmarks/serve_saturation.py ...'
    python3 benchmarks/in_turn.py --json-key images_per_second \\
        --run t2='python3 -m vggserve batch ... --summary {json}' --run t3='VGGSERVE_BATCH_TOKENS=20 python3 ...'

Each --run is NAME=COMMAND, run by bash from this directory; `{json}` in a command becomes a file of that run's own,
from which --json-key (dotted: `a.b.0.c`) reads the figure, where --pattern instead reads it from the command's
output (its first group, commas dropped). Every run's output is kept in --log-dir (NAME-ROUND.txt, and NAME-ROUND.json
for `{json}`). A run that fails (non-zero exit, timeout, no figure) is shown so and left out of the medians; the exit
status is then 1. --json FILE writes the figures, the medians and the ratios.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median


def parse_run(text: str) -> tuple[str, str]:
    """NAME=COMMAND as (name, command); ValueError unless both are there and the name is a plain word."""
    name, sep, command = text.partition("=")
    if not sep or not re.fullmatch(r"[A-Za-z0-9_.+-]+", name) or not command.strip():
        raise ValueError(f"--run takes NAME=COMMAND with NAME of letters, digits and _.+- : {text!r}")
    return name, command


def order(variants: int, rounds: int) -> list[list[int]]:
    """Each round's order of the variants: 0..k-1, then k-1..0, and so on."""
    forward = list(range(variants))
    return [forward if r % 2 == 0 else forward[::-1] for r in range(rounds)]


def figure_of(output: str, json_path: Path | None, pattern: str | None, key: str | None) -> float | None:
    """The run's figure: the JSON file's value at the dotted `key`, or `pattern`'s first group in the output (its
    whole match without groups); None where there is none or it is not a number."""
    try:
        if key is not None:
            value = json.loads(json_path.read_text()) if json_path is not None and json_path.exists() else None
            for part in key.split("."):
                if isinstance(value, list) and part.lstrip("-").isdigit():
                    value = value[int(part)]
                elif isinstance(value, dict):
                    value = value[part]
                else:
                    return None
            return float(value)
        found = re.search(pattern, output, re.MULTILINE)
        if found is None:
            return None
        return float((found.group(1) if found.groups() else found.group(0)).replace(",", ""))
    except (KeyError, IndexError, TypeError, ValueError, OSError):
        return None


def run_one(command: str, log: Path, json_path: Path, timeout_s: float) -> tuple[int, str, float]:
    """(exit status, 124 on timeout; output, stdout and stderr together; seconds) of one run, its output kept in
    `log`."""
    started = time.perf_counter()
    try:
        done = subprocess.run(["bash", "-c", command.replace("{json}", str(json_path))], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout_s)
        rc, output = done.returncode, done.stdout
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or ""
        rc, output = 124, (out.decode(errors="replace") if isinstance(out, bytes) else out)
    log.write_text(output)
    return rc, output, time.perf_counter() - started


def summary(names: list[str], figures: list[list[float | None]]) -> dict:
    """Medians per variant, the medians' ratio to the first variant's, and each round's ratio to the first variant's
    run of that round (None where either run failed)."""
    medians = [median(f for f in row if f is not None) if any(f is not None for f in row) else None
               for row in figures]
    first = figures[0]
    out = {"variants": {}}
    for name, row, mid in zip(names, figures, medians):
        per_round = [x / y if x is not None and y else None for x, y in zip(row, first)]
        out["variants"][name] = {"figures": row, "median": mid,
                                 "median_ratio": mid / medians[0] if mid is not None and medians[0] else None,
                                 "round_ratios": per_round}
    return out


def table(names: list[str], result: dict, rounds: int) -> str:
    def figure(x):
        return "failed" if x is None else f"{x:,.1f}"

    def ratio(x):
        return "failed" if x is None else f"{x:.3f}x"

    head = ["variant"] + [f"round {r + 1}" for r in range(rounds)] + ["median", f"median / {names[0]}'s",
                                                                      f"each round / {names[0]}'s"]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (rounds + 2) + "|---|"]
    for name in names:
        v = result["variants"][name]
        cells = [name, *map(figure, v["figures"]), figure(v["median"]), ratio(v["median_ratio"]),
                 ", ".join(map(ratio, v["round_ratios"]))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", action="append", default=[], metavar="NAME=COMMAND", help="a variant (repeatable)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, each running every variant once (default 3)")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--pattern", help="a regular expression whose first group in a run's output is its figure")
    how.add_argument("--json-key", help="the dotted key of the figure in the JSON file a run writes to {json}")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one run may take (default 600)")
    p.add_argument("--log-dir", default=None, help="where each run's output goes (default: a temp dir)")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    try:
        runs = [parse_run(text) for text in args.run]
        if args.pattern is not None:
            re.compile(args.pattern)
    except (ValueError, re.error) as exc:
        print(f"in_turn: {exc}", file=sys.stderr)
        return 2
    names = [name for name, _ in runs]
    if not runs or len(set(names)) != len(names) or args.rounds < 1:
        print("in_turn: give one --run or more, each with its own name, and --rounds 1 or more", file=sys.stderr)
        return 2
    logs = Path(args.log_dir or tempfile.mkdtemp(prefix="vggserve-in-turn-"))
    logs.mkdir(parents=True, exist_ok=True)
    figures: list[list[float | None]] = [[None] * args.rounds for _ in runs]
    failed = 0
    for r, turn in enumerate(order(len(runs), args.rounds)):
        for i in turn:
            name, command = runs[i]
            json_path = logs / f"{name}-{r + 1}.json"
            rc, output, seconds = run_one(command, logs / f"{name}-{r + 1}.txt", json_path, args.timeout)
            value = figure_of(output, json_path, args.pattern, args.json_key) if rc == 0 else None
            figures[i][r] = value
            failed += value is None
            shown = f"{value:,.1f}" if value is not None else f"failed (exit {rc}{', no figure' if rc == 0 else ''})"
            print(f"round {r + 1} {name}: {shown} ({seconds:.1f} s)", flush=True)
    result = summary(names, figures)
    result.update({"rounds": args.rounds, "runs": dict(runs), "order": order(len(runs), args.rounds),
                   "log_dir": str(logs)})
    print(f"\n{len(runs)} variants, {args.rounds} rounds in turn (each round's order reversed from the last's); "
          f"outputs in {logs}")
    print(table(names, result, args.rounds))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
