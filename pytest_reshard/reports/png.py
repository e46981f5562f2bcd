"""The report's charts as PNG files, with matplotlib (the optional ``report`` extra).

PNGs are what a chat message, a ticket or a GitHub comment can show; the HTML report draws the
same data as SVG and does not need them. matplotlib is imported only here and only when a report
is written; without it ``write`` says that the PNGs were skipped and why.
"""
from __future__ import annotations

from pathlib import Path

from pytest_reshard.contract import RunDir
from pytest_reshard.history import LOAD, SAVE
from pytest_reshard.reports.charts import FAULT_COLOUR, ChartData, colour

INSTALL_HINT = "pip install 'pytest-reshard[report]'"


def missing() -> str | None:
    """Why PNGs cannot be drawn here, or None when they can."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        return f"matplotlib is not installed ({e}); {INSTALL_HINT} to get PNG plots"
    return None


def write(data: ChartData, folder: Path) -> list[Path]:
    """``loss.png`` and ``timeline.png`` in ``folder``. Raises ImportError without matplotlib."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    paths = [RunDir(folder).plot("loss"), RunDir(folder).plot("timeline")]
    _loss(Figure(figsize=(10, 3.6), layout="constrained"), data).savefig(paths[0], dpi=100)
    _timeline(Figure(figsize=(10, 1.2 + 0.45 * max(data.ranks, 1)), layout="constrained"),
              data).savefig(paths[1], dpi=100)
    return paths


def _loss(fig, data: ChartData):
    ax = fig.add_subplot()
    for g in data.generations:
        if g.first_step is not None and g.last_step is not None:
            ax.axvspan(g.first_step, g.last_step + 1, color=colour(g.gen), alpha=0.10, lw=0)
    if data.reference:
        xs, ys = zip(*data.reference, strict=True)
        ax.plot(xs, ys, "--", color="#555", lw=2,
                label=f"reference (world size {data.reference_world_size})")
    for gen in sorted({p.gen for p in data.chaos}):
        pts = [p for p in data.chaos if p.gen == gen]
        c = colour(gen)
        ws = next((g.world_size for g in data.generations if g.gen == gen), "?")
        ax.plot([p.step for p in pts], [p.loss for p in pts], "-", color=c, lw=2,
                label=f"generation {gen} ({ws} ranks)")
        ax.scatter([p.step for p in pts], [p.loss for p in pts], s=16, zorder=3,
                   facecolors=[c if p.kept else "white" for p in pts], edgecolors=c)
    for f in data.faults:
        ax.axvline(f.x, color=FAULT_COLOUR if f.fired else "#999", ls=":", lw=1.5)
        ax.annotate(f.kind_label + ("" if f.fired else " (never fired)"), (f.x, 1), xycoords=("data", "axes fraction"),
                    xytext=(3, -12), textcoords="offset points", fontsize=8,
                    color=FAULT_COLOUR if f.fired else "#999")
    losses = [p.loss for p in data.chaos] + [v for _, v in data.reference]
    if losses and min(losses) > 0 and max(losses) / min(losses) > 20:
        ax.set_yscale("log")
    ax.set_xlim(0, max(data.steps, 1))
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("loss: chaos run (points hollow where a later resume threw the step away) "
                 "vs reference", fontsize=10)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper right")
    return fig


def _timeline(fig, data: ChartData):
    ax = fig.add_subplot()
    u = data.axis  # wall time -> fraction of the width, idle gaps squeezed
    for g in data.generations:
        if g.t0 is not None:
            ax.axvspan(u(g.t0), u(g.t1 if g.t1 is not None else data.duration), color=colour(g.gen),
                       alpha=0.07, lw=0)
            ax.axvline(u(g.t0), color=colour(g.gen), lw=1)
    for a, b in u.gaps:
        ax.axvspan(u(a), u(b), facecolor="none", edgecolor="#ccc", hatch="///", lw=0)
        ax.annotate(f"{b - a:.1f} s", ((u(a) + u(b)) / 2, 0), xycoords=("data", "axes fraction"),
                    xytext=(0, 2), textcoords="offset points", ha="center", fontsize=7, color="#888")
    runs: dict[tuple[int, int, bool, bool], list[tuple[float, float]]] = {}   # a call per look
    for bar in data.bars:
        runs.setdefault((bar.rank, bar.gen, bar.first_step % 2 == 0, bar.done), []).append(
            (u(bar.t0), max(u(bar.t1) - u(bar.t0), 0.0005)))
    for (rank, gen, even, done), spans in runs.items():
        ax.broken_barh(spans, (rank - 0.35, 0.7), facecolors=colour(gen),
                       alpha=0.85 if even else 0.6, edgecolors=None if done else FAULT_COLOUR)
    for f in data.faults:
        if f.fired and f.t is not None and f.rows(data.ranks):
            ax.scatter([u(f.t)] * len(f.rows(data.ranks)), list(f.rows(data.ranks)), marker="D",
                       s=40, color=FAULT_COLOUR, zorder=3)
    for kind, marker, size, dy in ((SAVE, "v", 14, 0.42), (LOAD, "^", 14, 0.42), (None, "x", 50, 0)):
        marks = [m for m in data.marks if m.kind == kind or (kind is None and m.kind not in (SAVE, LOAD))]
        if marks:
            ax.scatter([u(m.t) for m in marks], [m.rank + dy for m in marks], marker=marker,
                       s=size, color="#333" if dy else "black", zorder=4 if kind is None else 3)
    ticks = u.ticks()
    ax.set_xticks([u(t) for t in ticks], [f"{t:g}" for t in ticks], fontsize=8)
    ax.set_ylim(max(data.ranks, 1) - 0.5, -0.5)
    ax.set_yticks(range(max(data.ranks, 1)), [f"rank {r}" for r in range(max(data.ranks, 1))])
    ax.set_xlim(0, 1)
    ax.set_xlabel("seconds since the first generation started (hatched: idle time squeezed)")
    ax.set_title("per-rank timeline (bars: steps; diamonds: faults; x: detections)", fontsize=10)
    return fig
