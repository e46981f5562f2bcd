"""The regression gate: save a run's numbers as a baseline, compare a later run against it.

    pytest --reshard-save-baseline=cu128 ...          # before the upgrade
    pytest --reshard-compare=cu128 --reshard-compare-fail="peak_mem:+150MB,step_time:+10%,throughput:-10%"

Metrics per scenario come from its history (no extra instrumentation): peak RSS per rank, median
step time, samples per second, relaunch time after a reshard, checkpoint save and load time, and a
digest of the loss trajectory; plus the environment (torch, CUDA, cuDNN, NCCL, GPU, Python).
An expression ``field:+N`` fails when the field grew by more than N, ``field:-N`` when it fell by
more than N; N is absolute (``MB``, ``GB``, ``ms``, ``s``, or a plain number) or relative (``%``).
"""
from __future__ import annotations

import hashlib
import json
import platform
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Metric name -> (unit, human name). Fields an expression may name.
FIELDS = {
    "peak_mem": ("bytes", "peak RSS of the biggest rank"),
    "step_time": ("s", "median step time (rank 0)"),
    "throughput": ("samples/s", "samples per second"),
    "relaunch": ("s", "median relaunch to the next generation's first step"),
    "save_time": ("s", "median checkpoint save"),
    "load_time": ("s", "median checkpoint load"),
}
_UNITS = {"": 1.0, "b": 1.0, "kb": 2.0 ** 10, "mb": 2.0 ** 20, "gb": 2.0 ** 30, "s": 1.0,
          "ms": 1e-3}
_TERM = re.compile(r"^(?P<field>[a-z_]+):(?P<sign>[+-])(?P<num>\d+(?:\.\d+)?)(?P<unit>%|[a-zA-Z]*)$")


class GateError(ValueError):
    """A malformed --reshard-compare-fail expression; the message says what is allowed."""


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


def metrics(history: Any) -> dict[str, Any]:
    """The gate's numbers for one run, from its history alone."""
    events = history.events
    peaks = [e["peak_bytes"] for e in events if e["ev"] == "rss"]
    begins: dict[tuple[int, int], float] = {}
    steps: list[float] = []
    for e in events:
        if e.get("rank") == 0 and e["ev"] == "begin":
            begins[(e["gen"], e["step"])] = e["t"]
        elif e.get("rank") == 0 and e["ev"] == "end" and (e["gen"], e["step"]) in begins:
            steps.append(e["t"] - begins[(e["gen"], e["step"])])
    kept = history.kept_samples()
    samples = sum(len(v) for v in kept.values())
    step_time = statistics.median(steps) if steps else None
    relaunch = []
    ends = {e["gen"]: e["t"] for e in events if e["ev"] == "gen_end"}
    for gen in sorted(history.generations)[1:]:
        firsts = [e["t"] for e in events if e["ev"] == "begin" and e.get("gen") == gen]
        if firsts and gen - 1 in ends:
            relaunch.append(min(firsts) - ends[gen - 1])
    losses = [round(loss, 6) for _, (_, loss) in sorted(history.kept_losses().items())]

    def median_of(kind: str) -> float | None:
        xs = [e["seconds"] for e in events if e["ev"] == kind and "seconds" in e]
        return statistics.median(xs) if xs else None

    return {
        "peak_mem": max(peaks) if peaks else None,
        "step_time": step_time,
        "throughput": (samples / len(kept)) / step_time if kept and step_time else None,
        "relaunch": statistics.median(relaunch) if relaunch else None,
        "save_time": median_of("ckpt_save"),
        "load_time": median_of("ckpt_load"),
        "loss_digest": hashlib.sha256(json.dumps(losses).encode()).hexdigest()[:16],
    }


def environment() -> dict[str, Any]:
    """What the numbers were measured on (the stack an upgrade changes)."""
    env: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform()}
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch  # noqa: F811
        except ImportError:
            return env
    env["torch"] = torch.__version__
    env["cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        env["cudnn"] = torch.backends.cudnn.version()
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


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

    def describe(self) -> str:
        return f"{self.run}: {FIELDS[self.field][1]} {_fmt(self.field, self.old)} -> " \
               f"{_fmt(self.field, self.new)} ({_delta(self.field, self.old, self.new)})" + \
               (f", beyond {self.limit.text}" if self.regressed and self.limit else "")


def compare(baseline: dict[str, Any], run: str, now: dict[str, Any],
            limits: list[Limit]) -> list[Change]:
    """Every field of ``run`` measured in both, marked regressed where a limit is passed."""
    before = baseline.get("runs", {}).get(run)
    if before is None:
        return []
    changes = []
    for field in FIELDS:
        old, new = before.get(field), now.get(field)
        if old is None or new is None:
            continue
        regressed, hit = False, None
        for limit in (lim for lim in limits if lim.field == field):
            delta = (new - old) if limit.sign == "+" else (old - new)
            allowed = limit.amount * abs(old) if limit.relative else limit.amount
            if delta > allowed:
                regressed, hit = True, limit
        changes.append(Change(run, field, old, new, hit, regressed))
    return changes


def _fmt(field: str, x: float) -> str:
    unit = FIELDS[field][0]
    if unit == "bytes":
        return f"{x / 2 ** 20:.0f} MB"
    if unit == "s":
        return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"
    return f"{x:.1f} {unit}"


def _delta(field: str, old: float, new: float) -> str:
    pct = f"{(new - old) / abs(old):+.1%}" if old else "n/a"
    sign = "+" if new >= old else "-"
    return f"{sign}{_fmt(field, abs(new - old))}, {pct}"
