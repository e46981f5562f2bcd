"""The regression gate: save a run's numbers as a baseline, compare a later run against it.

    pytest --reshard-save-baseline=cu128 ...          # before the upgrade
    pytest --reshard-compare=cu128 --reshard-compare-fail="peak_mem:+150MB,step_time:+10%,throughput:-10%"

Metrics per scenario come from its history (no extra instrumentation): peak RSS per rank, median
step time, samples per second, relaunch time after a reshard, checkpoint save and load time, and a
digest of the loss trajectory; plus the environment (torch, CUDA, cuDNN, NCCL, GPU, Python).
An expression ``field:+N`` fails when the field grew by more than N, ``field:-N`` when it fell by
more than N; N is absolute (``MB``, ``GB``, ``ms``, ``s``, or a plain number) or relative (``%``).

Under a fixed memory budget (``memory_budget_bytes``, the same in both runs) memory is judged per
rank, as headroom to the budget, because a torch upgrade that adds about 200 MB per GPU kills the
ranks with the least headroom:
``peak_mem:+N`` and ``headroom:-N`` limit how far any rank's headroom may fall, and without either
a fall of more than 10% of the budget fails, so a memory regression under a budget never passes.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_reshard.contract import Cause, Ev
from pytest_reshard.history import History
from pytest_reshard.supervisor.launch.fork import ForkLauncher
from pytest_reshard.supervisor.launch.local import LocalLauncher

#: Metric name -> (unit, human name). Fields an expression may name.
FIELDS = {
    "device_mem": ("bytes", "peak device memory of the biggest rank (as the workload reports it)"),
    "device_reserved": ("bytes", "peak device memory the allocator reserved, biggest rank"),
    "peak_mem": ("bytes", "peak RSS (VmHWM) of the biggest rank"),
    "uss": ("bytes", "unique set of the biggest rank at its exit (pages no other process maps)"),
    "pss": ("bytes", "proportional set of the biggest rank at its exit (shared pages divided)"),
    "step_time": ("s", "median step time (rank 0)"),
    "throughput": ("samples/s", "samples per second"),
    "relaunch": ("s", "median relaunch to the next generation's first step"),
    "recovery": ("s", "median time from an unplanned failure to the next committed step"),
    "save_time": ("s", "median checkpoint save"),
    "load_time": ("s", "median checkpoint load"),
    "save_gbps": ("GB/s", "median checkpoint save throughput (bytes the workload reports)"),
    "load_gbps": ("GB/s", "median checkpoint load throughput (bytes the workload reports)"),
    "headroom": ("bytes", "headroom to the memory budget"),
}
#: Under a fixed budget with no memory limit given, a rank's headroom may fall by this much of it.
DEFAULT_HEADROOM_FALL = 0.10
_UNITS = {"": 1.0, "b": 1.0, "kb": 2.0 ** 10, "mb": 2.0 ** 20, "gb": 2.0 ** 30, "s": 1.0,
          "ms": 1e-3}
_TERM = re.compile(r"^(?P<field>[a-z_]+):(?P<sign>[+-])(?P<num>\d+(?:\.\d+)?)(?P<unit>%|[a-zA-Z]*)$")


#: The launcher whose ranks are forked from the harness's warm server, and a cold one, whose
#: ranks start as production starts them, each a fresh interpreter.
WARM_LAUNCHER, COLD_LAUNCHER = ForkLauncher.name, LocalLauncher.name
#: How the ranks' memory was measured (``memory_method``): in fresh interpreters, or in ranks
#: forked from the warm server, which map its preloaded memory (so their figures move with what
#: this version of the harness preloads).
COLD = "cold interpreters"
FORKED = "forked from the fork server of pytest-reshard {version}"
UNRECORDED = "a way not recorded (a baseline saved before the method was)"


class GateError(ValueError):
    """A malformed --reshard-compare-fail expression, or two runs that cannot be compared; the
    message says what is allowed."""


def memory_method(history: History) -> str:
    """``COLD``, or ``FORKED`` with this harness's version when any generation was forked."""
    if any(g.launcher == WARM_LAUNCHER for g in history.generations.values()):
        return FORKED.format(version=_harness_version())
    return COLD


def _harness_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("pytest-reshard")
    except PackageNotFoundError:  # a source tree on sys.path, not installed
        return "(not installed)"


@dataclass(frozen=True)
class Limit:
    field: str
    sign: str        # "+": may grow by at most amount; "-": may fall by at most amount
    amount: float    # absolute in the field's unit, or a fraction when relative
    relative: bool
    text: str


def parse(expr: str) -> list[Limit]:
    """``peak_mem:+150MB,step_time:+10%,throughput:-10%`` -> limits; raises GateError."""
    limits = []
    for term in filter(None, (t.strip() for t in expr.split(","))):
        m = _TERM.match(term)
        if not m:
            raise GateError(f"{term!r}: write FIELD:+N or FIELD:-N with N like 10%, 150MB, 50ms "
                            f"(fields: {', '.join(FIELDS)})")
        if m["field"] not in FIELDS:
            raise GateError(f"{term!r}: unknown field {m['field']!r}; fields: {', '.join(FIELDS)}")
        unit = m["unit"].lower()
        if unit != "%" and unit not in _UNITS:
            raise GateError(f"{term!r}: unknown unit {m['unit']!r}; use %, B, KB, MB, GB, ms or s")
        value = float(m["num"])
        relative = unit == "%"
        limits.append(Limit(m["field"], m["sign"], value / 100 if relative else value * _UNITS[unit],
                            relative, term))
    if not limits:
        raise GateError("empty expression: give at least one FIELD:+N or FIELD:-N")
    return limits


def metrics(history: History) -> dict[str, Any]:
    """The gate's numbers for one run, from its history alone."""
    memory = history.memory()  # rank -> its peaks over every generation
    peaks = [m.peak_bytes for m in memory.values() if m.peak_bytes is not None]
    reserved = [m.device_reserved_bytes for m in memory.values()
                if m.device_reserved_bytes is not None]
    uss = [m.uss_bytes for m in memory.values() if m.uss_bytes is not None]
    pss = [m.pss_bytes for m in memory.values() if m.pss_bytes is not None]
    by_rank = {str(r): m.peak_bytes for r, m in memory.items() if m.peak_bytes is not None}
    device = [m.device_peak_bytes for m in memory.values()   # reported against a device's size
              if m.device_peak_bytes is not None and m.device_total_bytes]
    budget = history.scenario.memory_budget_bytes if history.scenario else None
    steps = [span.seconds for span in history.step_spans(rank=0) if span.seconds is not None]
    kept = history.kept_samples()
    samples = sum(len(v) for v in kept.values())
    step_time = statistics.median(steps) if steps else None
    relaunch = []
    gens = history.generations
    for gen in sorted(gens)[1:]:
        firsts = history.times(Ev.BEGIN, gen=gen)
        ended_at = gens[gen - 1].ended_at if gen - 1 in gens else None
        if firsts and ended_at is not None:
            relaunch.append(min(firsts) - ended_at)
    losses = [round(loss, 6) for _, (_, loss) in sorted(history.kept_losses().items())]

    recovery = []
    for gen, g in sorted(gens.items()):
        if gen + 1 in gens and g.cause in (Cause.FAILURE, Cause.HANG):
            fired = [f.t for f in history.faults_fired() if f.gen == gen and f.t is not None]
            since = min(fired) if fired else g.ended_at
            done = history.times(Ev.END, gen=gen + 1)
            if since is not None and done:
                recovery.append(min(done) - since)

    def median_of(kind: str) -> float | None:
        xs = [c.seconds for c in history.checkpoints(kind) if c.seconds is not None]
        return statistics.median(xs) if xs else None

    def gbps(kind: str) -> float | None:
        xs = [c.bytes / c.seconds / 1e9 for c in history.checkpoints(kind) if c.bytes and c.seconds]
        return statistics.median(xs) if xs else None

    return {
        "peak_mem": max(peaks) if peaks else None,
        "peak_mem_by_rank": by_rank,
        "uss": max(uss) if uss else None,
        "pss": max(pss) if pss else None,
        "memory_method": memory_method(history),
        "device_mem": max(device) if device else None,
        "device_reserved": max(reserved) if reserved else None,
        "memory_budget": budget,
        "step_time": step_time,
        "throughput": (samples / len(kept)) / step_time if kept and step_time else None,
        "relaunch": statistics.median(relaunch) if relaunch else None,
        "recovery": statistics.median(recovery) if recovery else None,
        "save_time": median_of("save"),
        "load_time": median_of("load"),
        "save_gbps": gbps("save"),
        "load_gbps": gbps("load"),
        "loss_digest": hashlib.sha256(json.dumps(losses).encode()).hexdigest()[:16],
    }


def environment() -> dict[str, Any]:
    """What the numbers were measured on (the stack an upgrade changes)."""
    env: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                           "executable": sys.executable, "pytest-reshard": _harness_version()}
    try:
        import torch
    except ImportError:
        return env
    env["torch"] = torch.__version__
    env["cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        env["cudnn"] = torch.backends.cudnn.version()
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        env["gpu"] = torch.cuda.get_device_name(0)
        env["driver"] = _driver_version()
    return env


def _driver_version() -> str | None:
    try:
        import pynvml
    except ImportError:  # no nvidia-ml-py: the baseline says None
        return None
    try:
        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError:  # no driver
        return None
    return version.decode() if isinstance(version, bytes) else str(version)


def save(path: Path, runs: dict[str, dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"environment": environment(), "runs": runs}, indent=2))


def load(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise GateError(f"no baseline at {path}: save one first with --reshard-save-baseline")
    return json.loads(path.read_text())


@dataclass(frozen=True)
class Change:
    run: str
    field: str
    old: float
    new: float
    limit: Limit | None
    regressed: bool
    rank: str | None = None      # headroom: the rank judged (the one that lost the most)
    budget: float | None = None  # headroom: the fixed per-rank memory budget

    def describe(self) -> str:
        beyond = f", beyond {self.limit.text}" if self.regressed and self.limit else ""
        if self.field == "headroom":
            verb = "fell" if self.new < self.old else "rose" if self.new > self.old else "stayed"
            return (f"{self.run}: rank {self.rank} headroom {verb} from {_fmt('headroom', self.old)} "
                    f"to {_fmt('headroom', self.new)} ({_delta('headroom', self.old, self.new)}) "
                    f"under its {_fmt('headroom', self.budget or 0)} budget{beyond}")
        return f"{self.run}: {FIELDS[self.field][1]} {_fmt(self.field, self.old)} -> " \
               f"{_fmt(self.field, self.new)} ({_delta(self.field, self.old, self.new)}){beyond}"


def _passed(limit: Limit, old: float, new: float) -> bool:
    delta = (new - old) if limit.sign == "+" else (old - new)
    return delta > (limit.amount * abs(old) if limit.relative else limit.amount)


def compare(baseline: dict[str, Any], run: str, now: dict[str, Any],
            limits: list[Limit]) -> list[Change]:
    """Every field of ``run`` measured in both, marked regressed where a limit is passed.

    Under a fixed budget the memory limits are judged per rank, as one ``headroom`` change (see
    the module's docstring); the ``peak_mem`` change is then shown but not judged.
    """
    before = baseline.get("runs", {}).get(run)
    if before is None:
        return []
    methods = before.get("memory_method", UNRECORDED), now.get("memory_method", UNRECORDED)
    if methods[0] != methods[1]:
        raise GateError(f"{run}: the baseline's ranks ran in {methods[0]}, this run's in "
                        f"{methods[1]}: their memory and timings cannot be compared (a forked rank "
                        "maps what the harness preloaded and starts warm). Save the baseline and "
                        "compare with the same launcher; to gate a stack, use a cold one "
                        "(--reshard-launcher=local, as `pytest-reshard gate` does)")
    budget = before.get("memory_budget")
    fixed = budget if budget and budget == now.get("memory_budget") and \
        before.get("peak_mem_by_rank") and now.get("peak_mem_by_rank") else None
    changes = []
    for field in FIELDS:
        old, new = before.get(field), now.get(field)
        if field == "headroom" or old is None or new is None:
            continue
        regressed, hit = False, None
        for limit in (lim for lim in limits if lim.field == field):
            if _passed(limit, old, new) and not (fixed and field == "peak_mem"):
                regressed, hit = True, limit
        changes.append(Change(run, field, old, new, hit, regressed))
    room = _headroom(run, before["peak_mem_by_rank"], now["peak_mem_by_rank"], float(fixed),
                     limits) if fixed else None
    return changes + ([room] if room else [])


def _headroom(run: str, before: dict[str, int], now: dict[str, int], budget: float,
              limits: list[Limit]) -> Change | None:
    """The rank whose headroom fell the most, judged by the memory limits (or the default)."""
    memory = [lim for lim in limits if lim.field in ("peak_mem", "headroom")] or [
        Limit("headroom", "-", DEFAULT_HEADROOM_FALL * budget, False,
              f"the default limit for a fixed budget (headroom may fall by "
              f"{DEFAULT_HEADROOM_FALL:.0%} of it, {_fmt('headroom', DEFAULT_HEADROOM_FALL * budget)})")]
    judged = []
    for rank in sorted(set(before) & set(now)):
        hit = None
        for lim in memory:
            old, new = (before[rank], now[rank]) if lim.field == "peak_mem" else \
                (budget - before[rank], budget - now[rank])
            if _passed(lim, old, new):
                hit = lim
        judged.append((hit is not None, now[rank] - before[rank], rank, hit))
    if not judged:
        return None
    regressed, _, rank, hit = max(judged, key=lambda j: j[:3])  # failing first, then most lost
    return Change(run, "headroom", budget - before[rank], budget - now[rank], hit, regressed,
                  rank=rank, budget=budget)


def _fmt(field: str, x: float) -> str:
    unit = FIELDS[field][0]
    if unit == "bytes":
        return f"{x / 2 ** 20:.0f} MB"
    if unit == "s":
        return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"
    if unit == "GB/s":
        return f"{x:.3f} GB/s"
    return f"{x:.1f} {unit}"


def _delta(field: str, old: float, new: float) -> str:
    pct = f"{(new - old) / abs(old):+.1%}" if old else "n/a"
    sign = "+" if new >= old else "-"
    return f"{sign}{_fmt(field, abs(new - old))}, {pct}"


_ENV_KEYS = ("torch", "cuda", "cudnn", "nccl", "driver", "gpu", "python", "executable",
             "platform", "pytest-reshard")


def _short(value: str) -> str:
    """A path under the working directory, relative to it (the table stays readable)."""
    if value.startswith("/"):
        rel = os.path.relpath(value)
        return rel if not rel.startswith("..") else value
    return value


def diff_table(old: dict[str, Any], new: dict[str, Any], limits: list[Limit],
               labels: tuple[str, str] = ("old", "new")) -> tuple[list[str], list[Change], list[str]]:
    """Two saved baselines side by side: (table lines, changes, problems: a scenario that ran in
    one only, or whose ranks were measured differently).

    The table has the environments first (what the upgrade changed) and how the ranks ran,
    then every scenario's numbers, each with its change and whether it passed a limit.
    """
    rows: list[tuple[str, ...]] = [("", *labels, "change", "verdict")]
    envs = old.get("environment", {}), new.get("environment", {})
    for key in (*_ENV_KEYS, *sorted((set(envs[0]) | set(envs[1])) - set(_ENV_KEYS))):
        a, b = (_short(str(e.get(key, "-"))) for e in envs)
        if (a != "-" or b != "-") and (a != b or key != "platform"):
            rows.append((key, a, b, "changed" if a != b else "", ""))
    changes: list[Change] = []
    problems: list[str] = []
    runs_old, runs_new = old.get("runs", {}), new.get("runs", {})
    methods = [sorted({r.get("memory_method", UNRECORDED) for r in runs.values()})
               for runs in (runs_old, runs_new)]
    rows.append(("ranks ran in", *("; ".join(m) or "-" for m in methods), "", ""))
    for run in sorted(set(runs_old) | set(runs_new)):
        short = run.rsplit("::", 1)[-1]
        if run not in runs_old or run not in runs_new:
            problems.append(f"scenario {run} ran in one stack only")
            rows.append((short, "ran" if run in runs_old else "missing",
                         "ran" if run in runs_new else "missing", "", "FAIL: not in both runs"))
            continue
        try:
            compared = compare(old, run, runs_new[run], limits)
        except GateError as e:
            problems.append(str(e))
            rows.append((short, "", "", "", "FAIL: measured differently"))
            continue
        for c in compared:
            changes.append(c)
            name = f"rank {c.rank} headroom" if c.field == "headroom" else c.field
            verdict = f"FAIL beyond {c.limit.text}" if c.regressed and c.limit else "ok"
            rows.append((f"{short} {name}", _fmt(c.field, c.old), _fmt(c.field, c.new),
                         _delta(c.field, c.old, c.new), verdict))
        a, b = runs_old[run].get("loss_digest"), runs_new[run].get("loss_digest")
        if a and b:
            rows.append((f"{short} loss trajectory", a, b, "identical" if a == b else "differs",
                         "info"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines, changes, problems


def steps_table(old: dict[str, Any], via: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Each scenario's numbers through a stack between the two: which step cost what."""
    rows: list[tuple[str, ...]] = []
    runs = old.get("runs", {}), via.get("runs", {}), new.get("runs", {})
    for run in sorted(set(runs[0]) & set(runs[1]) & set(runs[2])):
        for field in FIELDS:
            a, b, c = (r[run].get(field) for r in runs)
            if a is None or b is None or c is None:
                continue
            rows.append((f"{run.rsplit('::', 1)[-1]} {field}", _fmt(field, a),
                         f"-> {_fmt(field, b)} ({_delta(field, a, b)})",
                         f"-> {_fmt(field, c)} ({_delta(field, b, c)})"))
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]


def mixed_change_note(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """A line saying that torch's version and its build both changed, when they did: the
    comparison cannot say which of the two cost what."""
    envs = old.get("environment", {}), new.get("environment", {})
    versions = [str(e.get("torch", "")).partition("+")[0] for e in envs]
    builds = [e.get("cuda") for e in envs]
    if not all(versions) or versions[0] == versions[1] or builds[0] == builds[1]:
        return []
    return [f"note: torch's version ({versions[0]} -> {versions[1]}) and its build (CUDA "
            f"{builds[0]} -> {builds[1]}) both changed; --via ENV (torch {versions[1]} built as "
            f"the old one, or {versions[0]} built as the new) says which of the two cost what"]
