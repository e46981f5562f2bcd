"""The file-event sweep's matrix: each event of the save, killed before it or torn, and the verdict.

Drawn from summary rows that carry a ``file_point`` (``reports.table.file_point``), so the rows of
every xdist worker make one matrix on the controller.
"""
from __future__ import annotations

import json
import os
from html import escape
from pathlib import Path
from typing import Any, Mapping, Sequence

from pytest_reshard.reports.table import MARK

__all__ = ["points_of", "matrix_lines", "write_matrix"]

MODES = ("before", "torn")


def points_of(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per swept scenario, in save order: what was hit and how it was judged."""
    out = []
    for r in rows:
        p = r.get("file_point")
        if not p:
            continue
        failed = [c for c, v in r["checks"].items() if v["status"] != "pass"]
        first = next((r["checks"][c]["message"] for c in failed), "")
        op, _, path = (p.get("hit") or "").partition(" ")
        out.append({"step": p["step"], "event": p["event"], "mode": p["mode"],
                    "op": op or "(not reached)", "path": path, "verdict": r["status"],
                    "failed": failed, "message": first, "name": r["name"],
                    "replay": r.get("replay"), "report": r.get("report")})
    return sorted(out, key=lambda x: (x["step"], x["event"], MODES.index(x["mode"])
                                      if x["mode"] in MODES else 9))


def smallest_failing(points: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The earliest event of the save whose crash fails: the minimal scenario to replay."""
    return next((p for p in points if p["verdict"] != "pass"), None)


def matrix_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    points = points_of(rows)
    if not points:
        return []
    cells: dict[tuple[int, int], dict[str, Any]] = {}
    for p in points:
        cell = cells.setdefault((p["step"], p["event"]), {"op": p["op"], "path": p["path"]})
        cell[p["mode"]] = MARK.get(p["verdict"], p["verdict"])
    counts = {s: sum(1 for p in points if p["verdict"] == s) for s in ("pass", "fail", "unknown")}
    table = [["step", "event", "op", "path", *MODES]]
    for (step, event), c in cells.items():
        table.append([str(step), str(event), c["op"], c["path"], *(c.get(m, "") for m in MODES)])
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = [f"{len(points)} crash points: {counts['pass']} passed, {counts['fail']} failed, "
             f"{counts['unknown']} unknown"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    worst = smallest_failing(points)
    if worst is not None:
        lines.append(f"smallest failing point: {worst['name']} ({', '.join(worst['failed'])}): "
                     f"{worst['message']}")
        if worst.get("replay"):
            lines.append(f"  replay: {worst['replay']}")
    return lines


def write_matrix(folder: Path, rows: Sequence[Mapping[str, Any]]) -> Path | None:
    """``sweep.html`` and ``sweep.json`` in ``folder``; the HTML's path (None: no sweep ran)."""
    points = points_of(rows)
    if not points:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sweep.json").write_text(json.dumps(points, indent=1))
    body = []
    for p in points:
        href = os.path.relpath(p["report"], folder) if p.get("report") else None
        verdict = escape(p["verdict"])
        cell = f'<a href="{escape(href)}">{verdict}</a>' if href else verdict
        body.append(f'<tr><td>{p["step"]}</td><td>{p["event"]}</td><td>{escape(p["op"])}</td>'
                    f'<td>{escape(p["path"])}</td><td>{escape(p["mode"])}</td>'
                    f'<td class="{verdict}">{cell}</td><td>{escape(p["message"])}</td></tr>')
    worst = smallest_failing(points)
    replay = (f'<p id="smallest">smallest failing point: {escape(worst["name"])}<br>'
              f'<code>{escape(worst.get("replay") or "")}</code></p>') if worst else ""
    page = folder / "sweep.html"
    page.write_text(f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,"><title>file-event sweep</title>
<style>body{{font-family:sans-serif}} td,th{{padding:2px 8px;text-align:left}}
.pass{{background:#dfd}} .fail{{background:#fdd}} .unknown{{background:#ffd}}</style></head>
<body><h1>file-event sweep</h1>{replay}
<table id="sweep"><tr><th>step</th><th>event</th><th>op</th><th>path</th><th>mode</th><th>verdict</th><th>what happened</th></tr>
{"".join(body)}</table></body></html>
""")
    return page
