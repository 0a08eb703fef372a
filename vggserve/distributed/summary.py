"""The batch job's final summary: a dict (written with `--summary FILE.json`) and the text rank 0 prints.

Summary dict layout:

    {"images": int,              # images finished by this run (classified + errors)
     "classified": int, "errors": int,
     "already_done": int,        # skipped because an earlier run recorded them
     "wall_seconds": float,      # from the first chunk handed out to the last result written
     "setup_seconds": float,     # listing inputs, loading weights and building kernels on every rank
     "images_per_second": float, # images / wall_seconds, all ranks together
     "ranks": [{"rank", "device", "device_name", "images", "errors", "active_seconds",
                "images_per_second",           # per rank: its images / its active_seconds
                "cpu_ms_per_image",            # {stage: CPU ms per image} (decoding.stages), "rank_process"
                "wait_ms_per_image",           # {"device", "decode", "chunks"}: wall ms per image its runner waited
                "decode_processes", "decode_restarts",
                "decode_groups",               # with --decode gpu: {"decodes", "chunks_per_decode" (mean),
                                               #  "due": {"full", "end", "starve", "timeout": decodes}} (the
                                               #  rule that made each group due; decoding.device.chunks), else {}
                "host_share"},                 # {"cores", "host_cores", "local_ranks", "decode_processes",
                                               #  "decode_threads", "copy_threads"}: what the rank sized from its
                                               #  share of its host (distributed.cores.HostShare)
               ...],
     "output": str, "errors_file": str}
"""

from __future__ import annotations

from ..wording import count
from .cores import describe_share


def summarize(stats_by_rank: dict[int, dict], ranks: list[dict], wall: float, setup: float, skipped: int,
              output: str, errors_file: str) -> dict:
    """Combine per-rank stats (RankStats.as_dict; ranks that got no work may be missing) into the summary."""
    per_rank = []
    for info in ranks:
        stats = stats_by_rank.get(info["rank"], {})
        per_rank.append({
            "rank": info["rank"],
            "device": info["device"],
            "device_name": info["device_name"],
            "images": stats.get("images", 0),
            "errors": stats.get("errors", 0),
            "active_seconds": stats.get("active_seconds", 0.0),
            "images_per_second": stats.get("images_per_second", 0.0),
            "cpu_ms_per_image": stats.get("cpu_ms_per_image", {}),
            "wait_ms_per_image": stats.get("wait_ms_per_image", {}),
            "decode_processes": stats.get("decode_processes", 0),
            "decode_restarts": stats.get("decode_restarts", 0),
            "decode_groups": stats.get("decode_groups", {}),
            "host_share": stats.get("host_share", {}),
        })
    images = sum(entry["images"] for entry in per_rank)
    errors = sum(entry["errors"] for entry in per_rank)
    return {
        "images": images,
        "classified": images - errors,
        "errors": errors,
        "already_done": skipped,
        "wall_seconds": round(wall, 3),
        "setup_seconds": round(setup, 3),
        "images_per_second": round(images / wall, 3) if wall > 0 else 0.0,
        "ranks": per_rank,
        "output": output,
        "errors_file": errors_file,
    }


def format_summary(summary: dict) -> str:
    """Human-readable lines: totals, then one row per rank."""
    lines = [
        f"batch: {count(summary['images'], 'image')} ({summary['classified']} classified, "
        f"{count(summary['errors'], 'error')}) in {summary['wall_seconds']:.2f} s = "
        f"{summary['images_per_second']:.2f} images/s on {count(len(summary['ranks']), 'rank')}; "
        f"{summary['already_done']} already done before this run; "
        f"setup {summary['setup_seconds']:.1f} s",
        f"  {'rank':>4}  {'device':<10} {'images':>7} {'errors':>7} {'images/s':>9}  device name",
    ]
    for entry in summary["ranks"]:
        lines.append(
            f"  {entry['rank']:>4}  {entry['device']:<10} {entry['images']:>7} {entry['errors']:>7} "
            f"{entry['images_per_second']:>9.2f}  {entry['device_name']}"
        )
    for entry in summary["ranks"]:
        if entry.get("host_share"):
            lines.append(f"  rank {entry['rank']} share of its host: {describe_share(entry['host_share'])}")
    for entry in summary["ranks"]:
        if entry.get("cpu_ms_per_image"):
            lines.append(f"  rank {entry['rank']} CPU ms per image: {format_stages(entry['cpu_ms_per_image'])} "
                         f"({_decoding(entry)})")
        if entry.get("wait_ms_per_image"):
            lines.append(f"  rank {entry['rank']} waited ms per image: {format_stages(entry['wait_ms_per_image'])} "
                         f"(wall time for its device's results and for decodes)")
        if entry.get("decode_groups", {}).get("decodes"):
            lines.append(f"  rank {entry['rank']} decode_groups: {format_groups(entry['decode_groups'])}")
    lines.append(f"results: {summary['output']}  errors: {summary['errors_file']}")
    return "\n".join(lines)


def format_stages(stages: dict[str, float]) -> str:
    """"read 0.05, decode 2.31, ..." from {stage: CPU ms per image}."""
    return ", ".join(f"{stage.replace('_', ' ')} {ms:.2f}" for stage, ms in stages.items())


def format_groups(groups: dict) -> str:
    """"40 decodes, 3.20 chunks per decode; due: full 30, end 1, starve 9, timeout 0" from a rank's decode_groups."""
    due = ", ".join(f"{reason} {n}" for reason, n in groups.get("due", {}).items())
    return (f"{count(groups['decodes'], 'decode')}, {count(groups['chunks_per_decode'], 'chunk', spec='.2f')} per "
            f"decode; due: {due}")


def _decoding(entry: dict) -> str:
    procs = entry.get("decode_processes", 0)
    if not procs:
        return "decoded on threads of the rank"
    restarts = entry.get("decode_restarts", 0)
    return f"{count(procs, 'decode process', 'decode processes')}" + (f", {restarts} replaced" if restarts else "")
