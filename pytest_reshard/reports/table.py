"""The verdict table printed after a run (terminal summary and the main job).

Tables are drawn from summary rows (``summary_row``): plain JSON data, so rows made on pytest-xdist
workers travel to the controller, which prints one table for the whole session. ``Result``
objects are accepted too and turned into rows.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

COLUMNS = [("no_rewind", "rewind"), ("loss_continuity", "loss"),
           ("exactly_once_samples", "samples"), ("state_equivalence", "state"),
           ("liveness", "live"), ("poisoned_commit", "ecc"), ("sample_ledger", "ledger"),
           ("throughput", "tok/s"), ("memory_headroom", "mem")]
MARK = {"pass": "pass", "fail": "FAIL", "unknown": "?"}


Row = Mapping[str, Any]


def summary_row(result: Any, worker: str | None = None) -> dict[str, Any]:
    """A scenario's line of the summary as JSON-able data (what an xdist worker sends back)."""
    return {"name": result.name, "faults": result.scenario.schedule.describe(),
            "status": result.verdict.status, "wall_s": round(float(result.wall_s), 3),
            "replay": result.replay, "schedule_hash": result.scenario.schedule.hash,
            "checks": {c: {"status": v.status, "message": v.message} for c, v in result.verdicts.items()},
            "run_dir": str(result.run_dir),
            "report": str(result.report) if getattr(result, "report", None) else None,
            "worker": worker}


def rows_of(results: Sequence[Any]) -> list[Row]:
    return [r if isinstance(r, Mapping) else summary_row(r) for r in results]


def verdict_table(results: Sequence[Any]) -> list[str]:
    """One row per scenario: name, faults, each checker's verdict, wall time."""
    data = rows_of(results)
    rows = [["scenario", "faults", *(short for _, short in COLUMNS), "wall s"]]
    for r in data:
        rows.append([_short_name(r["name"]), r["faults"],
                     *(MARK[r["checks"][c]["status"]] if c in r["checks"] else "-" for c, _ in COLUMNS),
                     f"{r['wall_s']:.1f}"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    widths[1] = min(widths[1], 72)
    lines = ["  ".join(cell[:w].ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in data:
        for check, v in r["checks"].items():
            if v["status"] != "pass":
                lines.append(f"{_short_name(r['name'])}: {check} {v['status']}: {v['message']}")
        if r["status"] != "pass" and r.get("report"):
            lines.append(f"{_short_name(r['name'])}: report {r['report']}")
    return lines


def _short_name(nodeid: str) -> str:
    return nodeid.split("::")[-1]


def markdown_summary(results: Sequence[Any]) -> str:
    """The verdict table as Markdown, for ``$GITHUB_STEP_SUMMARY``."""
    data = rows_of(results)
    head = ["scenario", "faults", *(short for _, short in COLUMNS), "wall s"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in data:
        cells = [_short_name(r["name"]), r["faults"],
                 *(MARK[r["checks"][c]["status"]] if c in r["checks"] else "-" for c, _ in COLUMNS),
                 f"{r['wall_s']:.1f}"]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    failures = [f"- **{_short_name(r['name'])}** `{check}` {v['status']}: {v['message']}\n"
                f"  replay: `{r['replay']}`" + (f"\n  report: `{r['report']}`" if r.get("report") else "")
                for r in data for check, v in r["checks"].items() if v["status"] != "pass"]
    return "\n".join(["## reshard verdicts", "", *rows, "", *failures, ""])
