"""Static HTML reports: one page per scenario (``report.html`` beside its history) and one index
per session, for the engineer who opens the CI artifacts at 3 a.m.

A page is one self-contained file, no server and no script: the loss curve against the reference
run and the per-rank timeline as inline SVG (``charts``), the verdict table, the detections, the
replay command, links to the raw history and logs, and the same charts as PNG (``png_plots``,
embedded, and written beside the page) when matplotlib is installed.
"""
from __future__ import annotations

import base64
import statistics
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from pytest_reshard.contract import RunDir
from pytest_reshard.reports import charts
from pytest_reshard.reports import png as png_plots
from pytest_reshard.history import History

PAGE = "report.html"
INDEX = "index.html"
STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1000px;color:#222;padding:0 12px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.status{display:inline-block;padding:1px 10px;border-radius:10px;color:#fff;font-weight:600}
.pass{background:#2e7d32}.fail{background:#c62828}.unknown{background:#ef6c00}
td.pass,td.fail,td.unknown{color:#fff;text-align:center;font-weight:600}
table{border-collapse:collapse;width:100%}td,th{border:1px solid #ddd;padding:4px 8px;vertical-align:top;text-align:left}
th{background:#f5f5f5}pre{background:#f5f5f5;padding:10px;overflow-x:auto;white-space:pre-wrap}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:8px 0}dt{color:#666}dd{margin:0}
.legend span{margin-right:14px;white-space:nowrap}.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px}
.note{color:#8a6d3b;background:#fcf8e3;padding:6px 10px}img.plot{max-width:100%;border:1px solid #eee}
svg{max-width:100%;height:auto}
"""


@dataclass(frozen=True)
class WrittenReport:
    """What ``write`` produced: the page, the PNGs, and why PNGs were skipped (None if drawn)."""

    page: Path
    pngs: tuple[Path, ...]
    png_skipped: str | None


def write(result: Any, reference: History | None = None) -> WrittenReport:
    """Write ``report.html`` (and PNGs when matplotlib is there) into the result's run folder."""
    run_dir = Path(result.run_dir)
    data = charts.ChartData.build(result.history, reference)
    pngs: list[Path] = []
    skipped = png_plots.missing()
    if skipped is None:
        pngs = png_plots.write(data, run_dir)
    page = RunDir(run_dir).report
    page.write_text(render(result, data, pngs, skipped))
    return WrittenReport(page, tuple(pngs), skipped)


def render(result: Any, data: charts.ChartData, pngs: Sequence[Path] = (),
           png_skipped: str | None = None) -> str:
    sc = result.scenario
    status = result.verdict.status
    verdicts = result.verdicts
    rows = "".join(
        f'<tr class="check" data-check="{escape(name)}"><td>{escape(name)}</td>'
        f'<td class="{v.status}">{v.status}</td><td>{escape(v.message)}'
        f'{f"<br><small>{escape(v.where())}</small>" if v.status != "pass" and v.where() else ""}'
        f'</td></tr>' for name, v in verdicts.items())
    detections = result.history.detections()
    det_rows = "".join(
        f"<tr><td>{d.gen}</td><td>{escape(d.kind)}</td><td>{d.rank}</td><td>{d.step}</td>"
        f"<td>{escape(str(d.phase))}</td><td>{'' if d.exit_code is None else d.exit_code}</td>"
        f"<td>{'' if d.latency_s is None else f'{d.latency_s * 1000:.0f} ms'}</td>"
        f"<td>{'yes' if d.expected else 'no'}</td></tr>" for d in detections)
    gens = "".join(
        f"<tr><td>{g.gen}</td><td>{g.world_size}</td><td>{_span(g.first_step, g.last_step)}</td>"
        f"<td>{escape(g.cause or 'no end recorded')}</td><td>{escape(g.detail)}</td></tr>"
        for g in data.generations)
    faults = "".join(
        f"<li>{escape(f.label)}: {'fired on rank ' + ', '.join(map(str, f.ranks)) if f.fired else '<b>never fired</b>'}"
        f"{f' at {f.t:.3f} s (generation {f.gen})' if f.fired and f.t is not None else ''}</li>"
        for f in data.faults) or ("<li>none: a recorded job (record mode); its generations below "
                                  "say how each ended</li>" if _recorded(result) else
                                  "<li>none (a clean run)</li>")
    notes = "".join(f'<p class="note">{escape(n)}</p>' for n in data.notes)
    device_rows = _devices(result.history)
    legend_loss = charts.legend([("#555", "reference run (dashed)"),
                                 *charts.generation_legend(data.generations),
                                 (charts.FAULT_COLOUR, "fault (dotted line, where it fired)")])
    legend_tl = charts.legend([*charts.generation_legend(data.generations),
                               (charts.FAULT_COLOUR, "fault (diamond)"),
                               ("#000", "detection (x)"), ("#333", "checkpoint save / load (triangle)")])
    png_html = (f'<p class="note" id="png-skipped">PNG plots skipped: {escape(png_skipped)}</p>'
                if png_skipped else "".join(
                    f'<p><img class="plot" id="{p.stem}-png" alt="{p.stem} plot" '
                    f'src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}">'
                    f'<br><a href="{p.name}">{p.name}</a></p>' for p in pngs))
    folder = RunDir(result.run_dir)
    named = ((folder.scenario, ""), (folder.verdict, ""), (folder.events, "/"), (folder.logs, "/"))
    links = " &#183; ".join(f'<a href="{escape(href)}">{escape(href)}</a>' for href in
                            (p.name + slash for p, slash in named if p.exists()))
    faults_text = sc.schedule.describe() or "none"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>{escape(status.upper())} {escape(_short(result.name))} - pytest-reshard</title>
<style>{STYLE}</style></head>
<body>
<h1><span class="status {status}" id="status">{status.upper()}</span> {escape(result.name)}</h1>
<dl>
<dt>workload</dt><dd>{escape(str(sc.workload))} {escape(" ".join(sc.args))}</dd>
<dt>world size, steps</dt><dd>{sc.world_size}, {sc.steps}</dd>
<dt>faults</dt><dd>{escape(faults_text)}</dd>
{'' if _recorded(result) else f"<dt>seed, schedule</dt><dd>{sc.schedule.seed}, {escape(sc.schedule.hash)}</dd>"}
<dt>launcher, backend</dt><dd>{escape(sc.launcher)}, {escape(sc.backend)}</dd>
<dt>wall time</dt><dd>{'-' if result.wall_s is None else f'{result.wall_s:.1f} s'}</dd>
<dt>files</dt><dd>{links}</dd>
</dl>
<h2>Replay</h2>
<pre id="replay">{escape(result.replay)}</pre>
<h2>Verdicts</h2>
<table id="verdicts"><tr><th>checker</th><th>verdict</th><th>what happened</th></tr>{rows}</table>
<h2>Loss against the reference run</h2>
{notes}{charts.loss_svg(data)}
{legend_loss}
<p>Points: each step's loss (rank 0's); hollow where a later generation resumed before it, so its
effect was thrown away. Shaded: the steps each generation ran.</p>
<h2>Timeline (per rank)</h2>
{charts.timeline_svg(data)}
{legend_tl}
<p>Bars: one step from begin to end on that rank (alternate steps lighter); a dashed red outline
is a step that never ended. Hover any mark for details.</p>
<h2>Faults</h2>
<ul id="faults">{faults}</ul>
<h2>Generations</h2>
<table id="generations"><tr><th>gen</th><th>world size</th><th>steps</th><th>ended by</th><th>detail</th></tr>{gens}</table>
{f'<h2>Devices</h2><table id="devices"><tr><th>gen</th><th>rank</th><th>class</th><th>speed</th><th>share of the samples</th><th>median step</th><th>made real by</th></tr>{device_rows}</table>' if device_rows else ''}
{f'<h2>Detections</h2><table id="detections"><tr><th>gen</th><th>kind</th><th>rank</th><th>step</th><th>phase</th><th>exit</th><th>latency</th><th>expected</th></tr>{det_rows}</table>' if detections else ''}
<h2>PNG plots</h2>
{png_html}
</body></html>
"""


def write_index(folder: Path, rows: Sequence[Mapping[str, Any]], title: str = "reshard verdicts") -> Path:
    """``index.html`` in ``folder``: one line per scenario, linking its report."""
    from pytest_reshard.reports.table import MARK, columns_of, wall_text

    columns = columns_of(rows)
    folder.mkdir(parents=True, exist_ok=True)
    counts = {s: sum(1 for r in rows if r["status"] == s) for s in ("pass", "fail", "unknown")}
    head = "".join(f"<th>{escape(short)}</th>" for _, short in columns)
    body = []
    for r in rows:
        report = r.get("report")
        href = os.path.relpath(report, folder) if report else None
        name = (f'<a href="{escape(href)}">{escape(r["name"])}</a>' if href
                else escape(r["name"]))
        cells = "".join(
            f'<td class="{r["checks"][c]["status"]}">{MARK[r["checks"][c]["status"]]}</td>'
            if c in r["checks"] else "<td>-</td>" for c, _ in columns)
        body.append(f'<tr class="scenario" data-status="{r["status"]}"><td><span class="status '
                    f'{r["status"]}">{r["status"]}</span></td><td>{name}</td><td>{escape(r["faults"])}'
                    f'</td>{cells}<td>{wall_text(r["wall_s"])}</td></tr>')
    page = folder / INDEX
    page.write_text(f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,"><title>{escape(title)}</title><style>{STYLE}</style></head>
<body><h1>{escape(title)}</h1>
<p id="counts">{counts['pass']} passed, {counts['fail']} failed, {counts['unknown']} unknown</p>
<table id="scenarios"><tr><th>verdict</th><th>scenario</th><th>faults</th>{head}<th>wall s</th></tr>
{"".join(body)}</table></body></html>
""")
    return page


def _devices(history: History) -> str:
    """A heterogeneous world's rows: each rank's class, speed, share and median step time."""
    rows = []
    for gen, d in sorted(history.devices().items()):
        samples: dict[int, int] = {}
        for occ, e in history.records():
            if occ.gen == gen and e.get("samples"):
                samples[int(e["rank"])] = samples.get(int(e["rank"]), 0) + len(e["samples"])
        total = sum(samples.values())
        for rank, (cls, speed) in enumerate(zip(d.classes, d.speeds)):
            times = [s.end_t - s.begin_t for s in history.step_spans(gen=gen, rank=rank)
                     if s.end_t is not None]
            share = f"{samples.get(rank, 0) / total:.0%}" if total else "not recorded"
            step = f"{statistics.median(times) * 1000:.0f} ms" if times else ""
            rows.append(f"<tr><td>{gen}</td><td>{rank}</td><td>{escape(cls)}</td>"
                        f"<td>{speed:g}</td><td>{share}</td><td>{step}</td>"
                        f"<td title=\"{escape(d.why)}\">{escape(d.mode)}</td></tr>")
    return "".join(rows)


def _recorded(result: Any) -> bool:
    """A production job's recording judged by ``pytest-reshard judge`` (no harness ran it)."""
    return any(e.get("recorded") for e in result.history.supervisor_events("gen_start"))


def _span(a: int | None, b: int | None) -> str:
    return "none" if a is None else f"{a}-{b}"


def _short(name: str) -> str:
    return name.split("::")[-1]
