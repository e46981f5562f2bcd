"""What the report draws, read from a History, and its drawing as inline SVG.

Two charts tell the story of a chaos run at a glance:

- the **loss curve**: the chaos run's per-step loss (one line per generation; a hollow point is an
  occurrence whose effect was thrown away by a later resume) against the clean reference run,
  with each generation's steps shaded and each fault drawn where it fired;
- the **timeline**, in the manner of Jepsen's: one row per rank, one bar per step from its
  ``begin`` to its ``end`` in wall time, so a straggler, a death mid-step, a relaunch gap and the
  generation boundaries can be seen; faults, detections and checkpoints are marked on the rank
  they hit.

``ChartData.build`` is pure (no processes, no plotting library) so it is unit-tested on hand-built
histories; ``loss_svg`` and ``timeline_svg`` turn it into SVG with stable ids and classes that the
browser test queries; ``png_plots`` draws the same data with matplotlib.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

from pytest_reshard.history import LOAD, SAVE, Checkpoint, History, Occurrence
from pytest_reshard.schedule import kinds

#: Where in a step a phase sits, as a fraction of the step (for placing a fault on the x axis).
PHASE_AT = {"begin": 0.05, "startup": 0.0, "forward": 0.25, "backward": 0.5, "optimizer": 0.75,
            "checkpoint": 0.9, "end": 0.95}
#: One colour per generation (cycled), readable on white and told apart by colour-blind readers.
PALETTE = ["#4477aa", "#ee6677", "#228833", "#ccbb44", "#66ccee", "#aa3377", "#bbbbbb"]
FAULT_COLOUR = "#d62728"
MAX_BARS_PER_RANK = 600  # past this, consecutive steps of a rank merge into one bar
#: The timeline draws a row for at most this many ranks (the lowest): a row per rank of a
#: thousand-rank job is neither readable nor cheap to draw (millions of bars and marks).
MAX_RANK_ROWS = 64
MAX_BARS = 20_000   # in all: past this, each rank and generation merges its runs of steps


def colour(gen: int) -> str:
    return PALETTE[gen % len(PALETTE)]


@dataclass(frozen=True)
class LossPoint:
    step: int
    gen: int
    loss: float
    kept: bool       # its effect persisted into the final state


@dataclass(frozen=True)
class GenSpan:
    gen: int
    world_size: int
    first_step: int | None
    last_step: int | None
    t0: float | None  # seconds since the first generation started
    t1: float | None
    cause: str | None
    detail: str


@dataclass(frozen=True)
class FaultMark:
    id: int | None
    kind: str
    label: str           # "kill(rank:1) at step 7 backward"
    step: int
    phase: str
    fired: bool
    t: float | None = None   # first firing, seconds since the first generation started
    ranks: tuple[int, ...] = ()
    gen: int | None = None

    @property
    def x(self) -> float:
        return self.step + PHASE_AT.get(self.phase, 0.5)

    def rows(self, drawn: int) -> tuple[int, ...]:
        """The timeline rows of its ranks among the ``drawn`` ones (row 0 when it names none)."""
        return tuple(r for r in self.ranks if r < drawn) if self.ranks else (0,)

    @property
    def kind_label(self) -> str:
        """How the report names the kind: its declared label, else its name."""
        return kind_label(self.kind)


def kind_label(name: str) -> str:
    """A fault kind's declared label, else its name (also for a kind not registered here, as
    in a history recorded with a fault kind of another version or a conftest)."""
    try:
        return kinds.get(name).label or name
    except KeyError:
        return name


@dataclass(frozen=True)
class StepBar:
    gen: int
    rank: int
    first_step: int
    last_step: int       # == first_step unless merged
    t0: float
    t1: float
    done: bool           # every step in the bar ended on this rank


@dataclass(frozen=True)
class Mark:
    """A point event on one rank's row: a detection or a checkpoint save/load."""

    kind: str            # "died", "stopped", ... | "save" | "load"
    gen: int
    rank: int
    t: float
    label: str


@dataclass
class ChartData:
    steps: int
    chaos: list[LossPoint]
    reference: list[tuple[int, float]]
    reference_world_size: int | None
    generations: list[GenSpan]
    faults: list[FaultMark]
    bars: list[StepBar]
    marks: list[Mark]
    ranks: int
    duration: float
    axis: TimeAxis
    notes: list[str] = field(default_factory=list)  # what could not be drawn, and why

    @classmethod
    def build(cls, history: History, reference: History | None = None) -> ChartData:
        origin = _origin(history)
        kept = set(history.kept())
        chaos: list[LossPoint] = []
        for gen in sorted(history.generations):
            for step in sorted(history.begun(gen) | history.ended(gen)):
                loss = history.loss(gen, step)
                if loss is not None and math.isfinite(loss):
                    chaos.append(LossPoint(step, gen, loss, Occurrence(step, gen) in kept))
        ref: list[tuple[int, float]] = []
        ref_ws = None
        notes: list[str] = []
        if reference is not None:
            ref = sorted((s, loss) for s, (_, loss) in reference.kept_losses().items()
                         if math.isfinite(loss))
            ref_ws = reference.scenario.world_size if reference.scenario else None
        else:
            notes.append("no reference run to compare the loss with")
        if not chaos:
            notes.append("the workload recorded no loss (s.record(loss=...)), so there is no curve")
        bars, marks, end_t = _timeline(history, origin)
        gens = _generations(history, origin, end_t)
        faults = _faults(history, origin)
        seen = max((len(history.ranks_seen(g)) for g in history.generations), default=0)
        if seen > MAX_RANK_ROWS:
            notes.append(f"the timeline shows ranks 0..{MAX_RANK_ROWS - 1} of {seen}: the "
                         "verdicts name the others' faults and detections")
        steps = history.scenario.steps if history.scenario else 0
        steps = max([steps, *(p.step + 1 for p in chaos), *(s + 1 for s, _ in ref),
                     *(f.step + 1 for f in faults)])
        duration = max([end_t, *(g.t1 or 0.0 for g in gens), *(f.t or 0.0 for f in faults),
                        *(m.t for m in marks), 0.001])
        ranks = min(MAX_RANK_ROWS, max([g.world_size for g in history.generations.values()]
                                       + [b.rank + 1 for b in bars] + [0]))
        times = [*(t for b in bars for t in (b.t0, b.t1)), *(m.t for m in marks),
                 *(f.t for f in faults if f.t is not None),
                 *(t for g in gens for t in (g.t0, g.t1) if t is not None)]
        return cls(steps=steps, chaos=chaos, reference=ref, reference_world_size=ref_ws,
                   generations=gens, faults=faults, bars=bars, marks=marks, ranks=ranks,
                   duration=duration, axis=TimeAxis(times, duration), notes=notes)


def _origin(history: History) -> float:
    """Time zero: the first generation's start (the fork server's warm-up is not the run's)."""
    starts = [g.started_at for g in history.generations.values() if g.started_at is not None]
    times = starts or history.event_times()
    return min(times) if times else 0.0


def _since(t: float | None, origin: float) -> float | None:
    return None if t is None else t - origin


def _generations(history: History, origin: float, end_t: float) -> list[GenSpan]:
    starts = {gen: t for gen, g in history.generations.items()
              if (t := _since(g.started_at, origin)) is not None}
    ends = {gen: t for gen, g in history.generations.items()
            if (t := _since(g.ended_at, origin)) is not None}
    out = []
    for gen, g in sorted(history.generations.items()):
        steps = history.begun(gen) | history.ended(gen)
        out.append(GenSpan(gen=gen, world_size=g.world_size,
                           first_step=min(steps) if steps else None,
                           last_step=max(steps) if steps else None,
                           t0=starts.get(gen), t1=ends.get(gen, end_t if gen in starts else None),
                           cause=g.cause, detail=g.detail))
    return out


def _faults(history: History, origin: float) -> list[FaultMark]:
    fired: dict[int | None, list[Any]] = {}
    for f in history.faults_fired():
        fired.setdefault(f.id, []).append(f)
    times: dict[int | None, float | None] = {}
    for f in history.faults_fired():
        times.setdefault(f.id, _since(f.t, origin))
    scheduled = list(history.scenario.schedule.get("faults", [])) if history.scenario else []
    out = []
    for i, f in enumerate(scheduled):
        hits = fired.pop(i, [])
        out.append(FaultMark(id=i, kind=str(f.get("kind")), label=history.describe_fault(i) or "",
                             step=int(f.get("step", 0)), phase=str(f.get("phase", "")),
                             fired=bool(hits), t=times.get(i),
                             ranks=tuple(sorted({h.rank for h in hits})),
                             gen=hits[0].gen if hits else None))
    for fid, hits in fired.items():  # fired, yet not in the schedule (hand-built histories)
        h = hits[0]
        out.append(FaultMark(id=fid, kind=h.kind, label=f"{h.kind} at step {h.step} {h.phase}",
                             step=h.step, phase=h.phase, fired=True, t=times.get(fid),
                             ranks=tuple(sorted({x.rank for x in hits})), gen=h.gen))
    return out


def _timeline(history: History, origin: float) -> tuple[list[StepBar], list[Mark], float]:
    """Step bars and point marks per rank; also the time of the last event seen."""
    gen_end = {gen: t for gen, g in history.generations.items()
               if (t := _since(g.ended_at, origin)) is not None}
    last_t = 0.0
    raw: dict[tuple[int, int], list[StepBar]] = {}
    marks: list[Mark] = []
    saves: dict[tuple[int, int], list[Checkpoint]] = {}   # one pass: a thousand ranks save
    for c in history.checkpoints():
        saves.setdefault((c.gen, c.rank), []).append(c)
    for gen in sorted(history.generations):
        for rank in sorted(r for r in history.ranks_seen(gen) if r < MAX_RANK_ROWS):
            seen = history.times(None, gen=gen, rank=rank)
            if not seen:
                continue
            rank_last = max(seen) - origin
            last_t = max(last_t, rank_last)
            bars = raw.setdefault((gen, rank), [])
            for span in history.step_spans(gen=gen, rank=rank):
                s, t0 = span.step, span.begin_t - origin
                if span.end_t is not None:
                    bars.append(StepBar(gen, rank, s, s, t0, span.end_t - origin, True))
                else:  # begun, never ended: in flight when the rank stopped
                    bars.append(StepBar(gen, rank, s, s, t0, max(rank_last, gen_end.get(gen, t0)),
                                        False))
            for c in saves.get((gen, rank), ()):
                marks.append(Mark(c.kind, gen, rank, c.t - origin,
                                  f"g{gen} r{rank}: checkpoint {c.kind} of step {c.step}"))
    for d in history.detections():
        if d.rank is None or d.t is None or d.rank >= MAX_RANK_ROWS:
            continue
        t = d.t - origin
        where = f"step {d.step} {d.phase}" if d.step is not None else "before its first step"
        marks.append(Mark(d.kind, d.gen, d.rank, t, f"g{d.gen} r{d.rank} {d.kind} at {where}"
                          + (f" (exit {d.exit_code})" if d.exit_code is not None else "")
                          + (f", detected in {d.latency_s * 1000:.0f} ms" if d.latency_s else "")))
    most = max(1, min(MAX_BARS_PER_RANK, MAX_BARS // max(len(raw), 1)))
    bars = [b for key in sorted(raw) for b in _merge(sorted(raw[key], key=lambda b: b.t0), most)]
    last_t = max([last_t, *gen_end.values()])
    return bars, marks, last_t


def _merge(bars: list[StepBar], most: int) -> list[StepBar]:
    """Keep one bar per step up to ``most``; past that merge runs of steps."""
    if len(bars) <= most:
        return bars
    k = math.ceil(len(bars) / most)
    out = []
    for i in range(0, len(bars), k):
        chunk = bars[i:i + k]
        out.append(StepBar(chunk[0].gen, chunk[0].rank, chunk[0].first_step, chunk[-1].last_step,
                           chunk[0].t0, chunk[-1].t1, all(b.done for b in chunk)))
    return out


class TimeAxis:
    """Wall time -> a fraction of the chart's width, with long idle gaps squeezed.

    A rank's start-up (process group, imports) can take seconds while a step takes milliseconds;
    drawn to scale the steps would be a sliver. A gap with no event longer than ``max(1 s, 10%
    of the run)`` is squeezed to ``GAP`` of the width and labelled with its real length.
    """

    GAP = 0.04

    def __init__(self, times: Iterable[float], duration: float) -> None:
        points = sorted({0.0, duration, *(t for t in times if 0 <= t <= duration)})
        limit = max(1.0, 0.1 * duration)
        self.gaps = [(a, b) for a, b in itertools.pairwise(points) if b - a > limit]
        self.duration = duration
        busy = duration - sum(b - a for a, b in self.gaps)
        self._scale = (1 - self.GAP * len(self.gaps)) / busy if busy > 0 else 0.0

    def __call__(self, t: float) -> float:
        """Fraction of the width at time ``t``."""
        x, last = 0.0, 0.0
        for a, b in self.gaps:
            if t <= a:
                break
            x += (a - last) * self._scale
            if t < b:
                return x + self.GAP * (t - a) / (b - a)
            x += self.GAP
            last = b
        return x + (t - last) * self._scale

    def segments(self) -> list[tuple[float, float]]:
        """The drawn-to-scale stretches of time, between gaps."""
        out, last = [], 0.0
        for a, b in self.gaps:
            out.append((last, a))
            last = b
        out.append((last, self.duration))
        return [(a, b) for a, b in out if b > a]

    def ticks(self) -> list[float]:
        """Tick times in the to-scale stretches, about 10 across the width."""
        out: list[float] = []
        for a, b in self.segments():
            share = (self(b) - self(a)) or 0.0
            n = max(1, round(10 * share))
            out.extend(t for t in _ticks(a, b, n) if a <= t <= b)
        return out


# -- SVG ------------------------------------------------------------------------------------
WIDTH = 960
_LEFT, _RIGHT, _TOP = 64, 16, 28


class _Svg:
    def __init__(self, id_: str, height: int, title: str) -> None:
        self.parts = [(f'<svg id="{id_}" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
                      f'height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" '
                      f'aria-label="{escape(title)}" font-family="sans-serif" font-size="11">'),
                      f"<title>{escape(title)}</title>"]

    def add(self, text: str) -> None:
        self.parts.append(text)

    def done(self) -> str:
        return "\n".join([*self.parts, "</svg>"])


def _f(x: float) -> str:
    return f"{x:.1f}"


def _ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    """Round tick values covering [lo, hi]."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [round(first + i * step, 10) for i in range(int((hi - first) / step) + 1)]


def loss_svg(data: ChartData, height: int = 320) -> str:
    """The loss curve of the chaos run against the reference, generations shaded, faults marked."""
    svg = _Svg("loss-curve", height, "loss per step: chaos run against the clean reference run")
    plot_h = height - _TOP - 36
    x0, x1 = _LEFT, WIDTH - _RIGHT
    losses = [p.loss for p in data.chaos] + [v for _, v in data.reference]
    if not losses:
        svg.add(f'<text class="empty" x="{x0}" y="{_TOP + 20}">no loss recorded: '
                f'{escape("; ".join(data.notes))}</text>')
        return svg.done()
    lo, hi = min(losses), max(losses)
    log = lo > 0 and hi / lo > 20
    f = math.log10 if log else (lambda v: v)
    ylo, yhi = f(lo), f(hi)
    pad = (yhi - ylo) * 0.08 or abs(yhi) * 0.1 or 1.0
    ylo, yhi = ylo - pad, yhi + pad

    def X(step: float) -> float:
        return x0 + (x1 - x0) * step / max(data.steps, 1)

    def Y(v: float) -> float:
        return _TOP + plot_h * (1 - (f(v) - ylo) / (yhi - ylo))

    for g in data.generations:  # shaded generation bands
        if g.first_step is None or g.last_step is None:
            continue
        a, b = X(g.first_step), X(g.last_step + 1)
        svg.add(f'<g class="generation" data-gen="{g.gen}"><rect x="{_f(a)}" y="{_TOP}" '
                f'width="{_f(max(b - a, 1))}" height="{plot_h}" fill="{colour(g.gen)}" '
                f'fill-opacity="0.10"><title>generation {g.gen}: world size {g.world_size}, steps '
                f'{g.first_step}-{g.last_step}, ended: {escape(g.cause or "?")} '
                f'{escape(g.detail)}</title></rect>'
                f'<text x="{_f(a + 3)}" y="{_TOP + 12}" fill="{colour(g.gen)}">g{g.gen} '
                f'&#183; {g.world_size} ranks</text></g>')
    svg.add(f'<rect x="{x0}" y="{_TOP}" width="{x1 - x0}" height="{plot_h}" fill="none" stroke="#999"/>')
    for v in _ticks(ylo, yhi, 5):  # y axis
        y = _TOP + plot_h * (1 - (v - ylo) / (yhi - ylo))
        label = f"{10 ** v:.3g}" if log else f"{v:.3g}"
        svg.add(f'<line x1="{x0 - 4}" x2="{x1}" y1="{_f(y)}" y2="{_f(y)}" stroke="#eee"/>'
                f'<text x="{x0 - 6}" y="{_f(y + 4)}" text-anchor="end">{label}</text>')
    for s in _ticks(0, data.steps, 10):  # x axis
        svg.add(f'<text x="{_f(X(s))}" y="{_TOP + plot_h + 14}" text-anchor="middle">{s:g}</text>')
    svg.add(f'<text x="{(x0 + x1) / 2}" y="{height - 4}" text-anchor="middle">step</text>'
            f'<text x="12" y="{_TOP + plot_h / 2}" transform="rotate(-90 12 {_TOP + plot_h / 2})" '
            f'text-anchor="middle">loss{" (log)" if log else ""}</text>')
    if data.reference:
        pts = " ".join(f"{_f(X(s))},{_f(Y(v))}" for s, v in data.reference)
        svg.add(f'<polyline class="loss reference" points="{pts}" fill="none" stroke="#555" '
                f'stroke-width="2" stroke-dasharray="5 3"><title>clean reference run (world size '
                f'{data.reference_world_size})</title></polyline>')
    for gen in sorted({p.gen for p in data.chaos}):
        pts_ = [p for p in data.chaos if p.gen == gen]
        c = colour(gen)
        line = " ".join(f"{_f(X(p.step))},{_f(Y(p.loss))}" for p in pts_)
        svg.add(f'<g class="loss chaos" data-gen="{gen}"><polyline points="{line}" fill="none" '
                f'stroke="{c}" stroke-width="2"/>')
        for p in pts_:
            fill = c if p.kept else "white"
            svg.add(f'<circle class="{"kept" if p.kept else "discarded"}" cx="{_f(X(p.step))}" '
                    f'cy="{_f(Y(p.loss))}" r="3" fill="{fill}" stroke="{c}"><title>g{gen} step '
                    f'{p.step}: loss {p.loss:.5g}{"" if p.kept else " (thrown away by a later resume)"}'
                    f'</title></circle>')
        svg.add("</g>")
    for i, m in enumerate(data.faults):
        x = X(m.x)
        col = FAULT_COLOUR if m.fired else "#999"
        svg.add(f'<g class="fault{"" if m.fired else " unfired"}" data-kind="{escape(m.kind)}">'
                f'<line x1="{_f(x)}" x2="{_f(x)}" y1="{_TOP}" y2="{_TOP + plot_h}" stroke="{col}" '
                f'stroke-width="1.5" stroke-dasharray="4 2"/>'
                f'<text x="{_f(x + 3)}" y="{_TOP + 26 + 12 * (i % 4)}" fill="{col}">&#9889; '
                f'{escape(m.kind_label)}{"" if m.fired else " (never fired)"}</text>'
                f'<title>{escape(m.label)}{"" if m.fired else " - never fired"}</title></g>')
    return svg.done()


def timeline_svg(data: ChartData) -> str:
    """One row per rank, one bar per step in wall time; faults, detections, checkpoints marked."""
    row_h = 26
    height = _TOP + row_h * max(data.ranks, 1) + 48
    svg = _Svg("timeline", height, "per-rank timeline: steps in wall time, faults and generations")
    svg.add('<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
            'patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" stroke="#ccc" '
            'stroke-width="2"/></pattern></defs>')
    x0, x1 = _LEFT, WIDTH - _RIGHT
    bottom = _TOP + row_h * max(data.ranks, 1)

    def X(t: float) -> float:
        return x0 + (x1 - x0) * data.axis(t)

    for g in data.generations:
        if g.t0 is None:
            continue
        a, b = X(g.t0), X(g.t1 if g.t1 is not None else data.duration)
        label = f"g{g.gen} ({g.world_size}): {g.cause or '?'}"
        if b - a < 6.5 * len(label):
            label = f"g{g.gen}" if b - a > 16 else ""
        svg.add(f'<g class="generation" data-gen="{g.gen}"><rect x="{_f(a)}" y="{_TOP - 14}" '
                f'width="{_f(max(b - a, 1))}" height="{bottom - _TOP + 14}" fill="{colour(g.gen)}" '
                f'fill-opacity="0.07"/><line x1="{_f(a)}" x2="{_f(a)}" y1="{_TOP - 14}" '
                f'y2="{bottom}" stroke="{colour(g.gen)}"/><text x="{_f(a + 3)}" y="{_TOP - 4}" '
                f'fill="{colour(g.gen)}">{escape(label)}</text>'
                f'<title>generation {g.gen}, world size {g.world_size}, {g.t0:.2f}-'
                f'{(g.t1 or 0):.2f} s: {escape(g.cause or "?")} {escape(g.detail)}</title></g>')
    for r in range(data.ranks):
        y = _TOP + r * row_h
        svg.add(f'<g class="rank-row" data-rank="{r}"><text x="{x0 - 8}" y="{y + row_h / 2 + 4}" '
                f'text-anchor="end">rank {r}</text><line x1="{x0}" x2="{x1}" y1="{y + row_h}" '
                f'y2="{y + row_h}" stroke="#eee"/></g>')
    for bar in data.bars:
        y = _TOP + bar.rank * row_h + 4
        a, w = X(bar.t0), max(X(bar.t1) - X(bar.t0), 0.8)
        steps = f"step {bar.first_step}" if bar.first_step == bar.last_step else \
            f"steps {bar.first_step}-{bar.last_step}"
        shade = 0.85 if bar.first_step % 2 == 0 else 0.6
        extra = '' if bar.done else f' stroke="{FAULT_COLOUR}" stroke-dasharray="2 1" fill-opacity="0.25"'
        svg.add(f'<rect class="step{"" if bar.done else " unfinished"}" x="{_f(a)}" y="{y}" '
                f'width="{_f(w)}" height="{row_h - 8}" fill="{colour(bar.gen)}" opacity="{shade}"'
                f'{extra}><title>g{bar.gen} r{bar.rank} {steps}: {(bar.t1 - bar.t0) * 1000:.0f} ms'
                f'{"" if bar.done else ", never ended"}</title></rect>')
    for m in data.marks:
        x, y = X(m.t), _TOP + m.rank * row_h
        if m.kind in (SAVE, LOAD):
            pts = (f"{_f(x - 3)},{y + row_h - 2} {_f(x + 3)},{y + row_h - 2} {_f(x)},{y + row_h - 7}"
                   if m.kind == LOAD else
                   f"{_f(x - 3)},{y + row_h - 7} {_f(x + 3)},{y + row_h - 7} {_f(x)},{y + row_h - 2}")
            svg.add(f'<polygon class="checkpoint {m.kind}" points="{pts}" fill="#333">'
                    f'<title>{escape(m.label)}</title></polygon>')
        else:
            svg.add(f'<g class="detection" data-kind="{escape(m.kind)}"><path d="M{_f(x - 5)} '
                    f'{y + 4} l10 10 m0 -10 l-10 10" stroke="#000" stroke-width="2"/>'
                    f'<title>{escape(m.label)}</title></g>')
    for fault in data.faults:
        if not fault.fired or fault.t is None:
            continue
        x = X(fault.t)
        for r in fault.rows(data.ranks):
            y = _TOP + r * row_h
            svg.add(f'<g class="fault" data-kind="{escape(fault.kind)}"><polygon points="{_f(x)},'
                    f'{y + 2} {_f(x + 6)},{y + row_h / 2} {_f(x)},{y + row_h - 2} {_f(x - 6)},'
                    f'{y + row_h / 2}" fill="{FAULT_COLOUR}" stroke="white"/>'
                    f'<title>{escape(fault.label)} (rank {r}, {fault.t:.3f} s)</title></g>')
    for a, b in data.axis.gaps:  # squeezed idle stretches
        xa, xb = X(a), X(b)
        svg.add(f'<g class="gap"><rect x="{_f(xa)}" y="{_TOP}" width="{_f(xb - xa)}" '
                f'height="{bottom - _TOP}" fill="url(#hatch)"/><text x="{_f((xa + xb) / 2)}" '
                f'y="{bottom + 26}" text-anchor="middle" fill="#888">{b - a:.1f} s</text>'
                f'<title>{b - a:.2f} s with no event (start-up, relaunch), squeezed</title></g>')
    for t in data.axis.ticks():
        svg.add(f'<text x="{_f(X(t))}" y="{bottom + 14}" text-anchor="middle">{t:g}</text>')
    svg.add(f'<text x="{(x0 + x1) / 2}" y="{height - 4}" text-anchor="middle">seconds since the '
            f'first generation started (hatched: idle time squeezed)</text>')
    return svg.done()


def legend(items: Iterable[tuple[str, str]]) -> str:
    """HTML legend: (css colour or symbol html, text) pairs."""
    return '<p class="legend">' + " ".join(
        f'<span><i style="background:{c}"></i>{escape(t)}</span>' for c, t in items) + "</p>"


def generation_legend(gens: Sequence[GenSpan]) -> list[tuple[str, str]]:
    return [(colour(g.gen), f"generation {g.gen} ({g.world_size} ranks)") for g in gens]
