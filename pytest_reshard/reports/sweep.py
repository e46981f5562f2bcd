"""The file-event sweep's matrix: each event of the save, killed before it or torn, and the verdict.

Drawn from summary rows that carry a ``file_point`` (``reports.table.file_point``), so the rows of
every xdist worker make one matrix on the controller.
"""
from __future__ import annotations

import json
import os
import re
from html import escape
from pathlib import Path
from typing import Any, Mapping, Sequence

from pytest_reshard.contract import FileKill
from pytest_reshard.reports.table import MARK

__all__ = ["points_of", "matrix_lines", "write_matrix", "masked"]

MODES = tuple(FileKill)


def masked(name: str) -> str:
    """``name`` with its random parts as ``*``: the same in every run. Random is a hex run of 8
    or more with a letter among them, or of 12 digits or more (a random hex id is all digits
    once in 280 draws); a zero-padded step number (8 digits) stays."""
    return re.sub(r"(?=[0-9]*[a-f])[0-9a-f]{8,}|(?<![0-9a-f])[0-9]{12,}(?![0-9a-f])", "*", name)


def outcome(mode: str, verdict: str) -> str:
    """What a cell shows: a crash must pass; a flipped byte must be caught (a failed check)."""
    if mode == FileKill.FLIP:
        return {"fail": "caught", "pass": "MISSED"}.get(verdict, verdict)
    return MARK.get(verdict, verdict)


def points_of(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per swept scenario, in save order: what was hit and how it was judged."""
    out = []
    for r in rows:
        p = r.get("file_point")
        if not p:
            continue
        failed = [c for c, v in r["checks"].items() if v["status"] != "pass"]
        # crash_consistency says what the crash did to the files: its word first
        first = next((r["checks"][c]["message"] for c in sorted(
            failed, key=lambda c: c != "crash_consistency")), "")
        op, _, path = (p.get("hit") or "").partition(" ")
        path = masked(path)
        if p["mode"] == FileKill.FLIP:   # the kill comes later; the file is the one flipped
            op, path = "close", masked(p.get("flipped") or "")
        ok = (r["status"] == "fail") if p["mode"] == FileKill.FLIP else (r["status"] == "pass")
        out.append({"step": p["step"], "event": p["event"], "mode": p["mode"],
                    "op": op or "(not reached)", "path": path, "verdict": r["status"],
                    "outcome": outcome(p["mode"], r["status"]), "ok": ok,
                    "failed": failed, "message": first, "name": r["name"],
                    "replay": r.get("replay"), "report": r.get("report")})
    return sorted(out, key=lambda x: (x["step"], x["event"] or 0, MODES.index(x["mode"])
                                      if x["mode"] in MODES else 9))


def smallest_failing(points: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The earliest event of the save whose crash fails: the minimal scenario to replay."""
    return next((p for p in points if not p["ok"]), None)


def sweeps(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The crash points of each sweep (each test function), by its name."""
    out: dict[str, list[dict[str, Any]]] = {}
    for p in points_of(rows):
        out.setdefault(p["name"].split("[")[0], []).append(p)
    return out


def matrix_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One matrix per sweep: each event of the save, before / torn / flip, and the verdict."""
    lines: list[str] = []
    for name, points in sweeps(rows).items():
        lines += [name, *_matrix(points), ""]
    return lines[:-1]


def _matrix(points: Sequence[Mapping[str, Any]]) -> list[str]:
    cells: dict[tuple[int, int], dict[str, Any]] = {}
    for p in points:
        cell = cells.setdefault((p["step"], p["event"]), {"op": p["op"], "path": p["path"]})
        cell[p["mode"]] = p["outcome"]
    modes = [m for m in MODES if any(p["mode"] == m for p in points)]
    bad = sum(1 for p in points if not p["ok"])
    table = [["step", "event", "op", "path", *modes]]
    for (step, event), c in cells.items():
        table.append([str(step), str(event), c["op"], c["path"], *(c.get(m, "") for m in modes)])
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = [f"  {len(points)} crash points: {len(points) - bad} as they must be, {bad} not "
             "(a crash or a power loss must pass every checker; a flipped byte must be caught)"]
    lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
              for row in table]
    worst = smallest_failing(points)
    if worst is not None:
        why = f"({', '.join(worst['failed'])}): {worst['message']}" if worst["failed"] else \
            "(no checker noticed the flipped byte)"
        lines.append(f"  smallest failing point: {worst['name']} {why}")
        if worst.get("replay"):
            lines.append(f"    replay: {worst['replay']}")
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
        verdict = escape(p["outcome"])
        cell = f'<a href="{escape(href)}">{verdict}</a>' if href else verdict
        body.append(f'<tr><td>{p["step"]}</td><td>{p["event"]}</td><td>{escape(p["op"])}</td>'
                    f'<td>{escape(p["path"])}</td><td>{escape(p["mode"])}</td>'
                    f'<td class="{"pass" if p["ok"] else "fail"}">{cell}</td>'
                    f'<td>{escape(p["message"])}</td></tr>')
    tables = []
    for name, mine in sweeps(rows).items():
        worst = smallest_failing(mine)
        replay = (f'<p class="smallest">smallest failing point: {escape(worst["name"])}<br>'
                  f'<code>{escape(worst.get("replay") or "")}</code></p>') if worst else ""
        tables.append(f'<h2>{escape(name)}</h2>{replay}<table class="sweep"><tr><th>step</th>'
                      '<th>event</th><th>op</th><th>path</th><th>mode</th><th>verdict</th>'
                      '<th>what happened</th></tr>'
                      + "".join(body[points.index(p)] for p in mine) + "</table>")
    page = folder / "sweep.html"
    page.write_text(f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,"><title>file-event sweep</title>
<style>body{{font-family:sans-serif}} td,th{{padding:2px 8px;text-align:left}}
.pass{{background:#dfd}} .fail{{background:#fdd}} .unknown{{background:#ffd}}</style></head>
<body><h1>file-event sweep</h1>
{"".join(tables)}</body></html>
""")
    return page
