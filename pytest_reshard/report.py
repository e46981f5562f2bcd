"""The verdict table printed after a run (terminal summary and the main job)."""
from __future__ import annotations

from typing import Any, Sequence

COLUMNS = [("no_rewind", "rewind"), ("loss_continuity", "loss"),
           ("exactly_once_samples", "samples"), ("state_equivalence", "state"),
           ("liveness", "live"), ("poisoned_commit", "ecc"), ("memory_headroom", "mem")]
MARK = {"pass": "pass", "fail": "FAIL", "unknown": "?"}


def verdict_table(results: Sequence[Any]) -> list[str]:
    """One row per scenario: name, faults, each checker's verdict, wall time."""
    rows = [["scenario", "faults", *(short for _, short in COLUMNS), "wall s"]]
    for r in results:
        rows.append([_short_name(r.name), r.scenario.schedule.describe(),
                     *(MARK[r.verdicts[c].status] if c in r.verdicts else "-" for c, _ in COLUMNS),
                     f"{r.wall_s:.1f}"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    widths[1] = min(widths[1], 72)
    lines = ["  ".join(cell[:w].ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in results:
        for v in r.verdicts.values():
            if v.status != "pass":
                lines.append(f"{_short_name(r.name)}: {v.check} {v.status}: {v.message}")
    return lines


def _short_name(nodeid: str) -> str:
    return nodeid.split("::")[-1]


def markdown_summary(results: Sequence[Any]) -> str:
    """The verdict table as Markdown, for ``$GITHUB_STEP_SUMMARY``."""
    head = ["scenario", "faults", *(short for _, short in COLUMNS), "wall s"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        cells = [_short_name(r.name), r.scenario.schedule.describe(),
                 *(MARK[r.verdicts[c].status] if c in r.verdicts else "-" for c, _ in COLUMNS),
                 f"{r.wall_s:.1f}"]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    failures = [f"- **{_short_name(r.name)}** `{v.check}` {v.status}: {v.message}\n"
                f"  replay: `{r.replay}`"
                for r in results for v in r.verdicts.values() if v.status != "pass"]
    return "\n".join(["## reshard verdicts", "", *rows, "", *failures, ""])
