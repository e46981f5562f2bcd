"""The verdict table printed after a run (terminal summary and the main job).

Tables are drawn from summary rows (``summary_row``): plain JSON data, so rows made on pytest-xdist
workers travel to the controller, which prints one table for the whole session. ``Result``
objects are accepted too and turned into rows.

The columns come from the checker registry (``pytest_reshard.checkers``): one per checker that
ran in at least one row, in registration order. A row carries each of its checks' column header,
so a checker registered only where the row was made (an xdist worker's conftest) still gets its
column, after the registered ones.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from pytest_reshard import checkers
from pytest_reshard.contract import FileKill, FileOp

MARK = {"pass": "pass", "fail": "FAIL", "unknown": "?"}


Row = Mapping[str, Any]


def columns_of(rows: Sequence[Row]) -> list[tuple[str, str]]:
    """``(check, header)`` of each column for these rows: the registered checkers that ran in
    any of them (registration order), then checks this process did not register, headed as
    their rows say (else by the check's name). No rows: every registered checker."""
    if not rows:
        return checkers.columns()
    headers: dict[str, str] = {}
    for r in rows:
        headers.update({c: h for c, h in (r.get("columns") or {}).items() if c not in headers})
    return checkers.columns([c for r in rows for c in r["checks"]], headers)


def summary_row(result: Any, worker: str | None = None, *, swept: bool = False) -> dict[str, Any]:
    """A scenario's line of the summary as JSON-able data (what an xdist worker sends back);
    ``swept``: a point of a file-event sweep (the ``file_point`` fixture), for its matrix. A
    test of its own that kills at a file event is not one: it may expect a failure."""
    return {"name": result.name, "faults": result.scenario.schedule.describe(),
            "status": str(result.verdict.status),
            "wall_s": None if result.wall_s is None else round(float(result.wall_s), 3),
            "replay": result.replay, "schedule_hash": result.scenario.schedule.hash,
            "checks": {c: {"status": str(v.status), "message": v.message}
                       for c, v in result.verdicts.items()},
            "columns": {c: _header(c) for c in result.verdicts},
            "run_dir": str(result.run_dir),
            "report": str(result.report) if getattr(result, "report", None) else None,
            "worker": worker, "file_point": file_point(result) if swept else None}


def file_point(result: Any) -> dict[str, Any] | None:
    """For a scenario that kills at a file event: which one (step, event, mode), and the file
    operation the kill really hit (None: the count never reached it)."""
    from pytest_reshard.schedule import kinds

    for f in result.scenario.schedule.faults:
        if kinds.get(f.kind).watches_files:
            files = result.history.file_events()
            hit = next((e for e in files if e.killed and e.gen == 0), None)
            flipped = next((e.path for e in files if e.op == FileOp.FLIP), None)
            mode = FileKill.POWER if kinds.get(f.kind).loses_unsynced else f.params.get("mode")
            event = f.params.get("event") or (hit.n if hit is not None else None)  # by path: the hit's
            return {"step": f.step, "event": event, "mode": mode,
                    "flipped": flipped,
                    "hit": None if hit is None else
                    f"{hit.op} {hit.path}" + (f" -> {hit.dst}" if hit.dst else "")}
    return None


def _header(check: str) -> str:
    registered = checkers.get(check)
    return registered.column if registered is not None else check


def rows_of(results: Sequence[Any]) -> list[Row]:
    return [r if isinstance(r, Mapping) else summary_row(r) for r in results]


def verdict_table(results: Sequence[Any]) -> list[str]:
    """One row per scenario: name, faults, each checker's verdict, wall time."""
    data = rows_of(results)
    cols = columns_of(data)
    rows = [["scenario", "faults", *(short for _, short in cols), "wall s"]]
    for r in data:
        rows.append([_short_name(r["name"]), r["faults"],
                     *(MARK[r["checks"][c]["status"]] if c in r["checks"] else "-" for c, _ in cols),
                     wall_text(r["wall_s"])])
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


def wall_text(seconds: float | None) -> str:
    """A wall time in the tables; "-" for a recording (judged here, not run)."""
    return "-" if seconds is None else f"{seconds:.1f}"


def _short_name(nodeid: str) -> str:
    return nodeid.split("::")[-1]


def markdown_summary(results: Sequence[Any]) -> str:
    """The verdict table as Markdown, for ``$GITHUB_STEP_SUMMARY``."""
    data = rows_of(results)
    cols = columns_of(data)
    head = ["scenario", "faults", *(short for _, short in cols), "wall s"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in data:
        cells = [_short_name(r["name"]), r["faults"],
                 *(MARK[r["checks"][c]["status"]] if c in r["checks"] else "-" for c, _ in cols),
                 wall_text(r["wall_s"])]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    failures = [f"- **{_short_name(r['name'])}** `{check}` {v['status']}: {v['message']}\n"
                f"  replay: `{r['replay']}`" + (f"\n  report: `{r['report']}`" if r.get("report") else "")
                for r in data for check, v in r["checks"].items() if v["status"] != "pass"]
    return "\n".join(["## reshard verdicts", "", *rows, "", *failures, ""])


def __getattr__(name: str) -> Any:
    """``COLUMNS``: every registered checker's ``(check, header)``, read from the registry at
    each access (the name older callers import; ``columns_of(rows)`` also covers rows' own)."""
    if name == "COLUMNS":
        return checkers.columns()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
