"""Verdicts: what a checker concluded about a history (a contract).

Like Jepsen's checkers, a verdict is ``pass``, ``fail``, or ``unknown`` (the history cannot tell,
e.g. a rank died mid-step or the workload recorded nothing to check), and several verdicts combine
with the priority fail > unknown > pass. A verdict carries *where* it happened (step, rank,
generation, the fault that preceded it) and how to replay the run, so a failing test's one line
is enough to start debugging.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Iterable, Mapping

__all__ = ["Verdict", "Status", "combine", "PASS", "FAIL", "UNKNOWN"]


class Status(str, Enum):
    """The statuses a verdict can have. A ``str`` Enum (``Status.PASS == "pass"``, formats and
    hashes as ``"pass"``), accepted wherever a status is given. ``Verdict.status`` itself stays
    the plain string: statuses travel where only built-in types may (JSON, pytest-xdist's
    channel, junit properties), and ``Status(v.status)`` gives the member back."""

    PASS = "pass"
    FAIL = "fail"
    UNKNOWN = "unknown"

    __str__ = str.__str__
    __hash__ = str.__hash__   # Enum hashes the member *name*; a dict keyed by "pass" must find it

    def __format__(self, format_spec: str) -> str:
        return str.__format__(self, format_spec)


PASS, FAIL, UNKNOWN = Status.PASS.value, Status.FAIL.value, Status.UNKNOWN.value
_RANK = {PASS: 0, UNKNOWN: 1, FAIL: 2}


@dataclass(frozen=True)
class Verdict:
    status: str                  # "pass" | "fail" | "unknown" (a Status member is accepted)
    check: str                   # the checker's name, e.g. "no_rewind"
    message: str                 # what happened, where, and what to do
    step: int | None = None
    rank: int | None = None
    generation: int | None = None
    fault: str | None = None     # the scheduled fault involved, described
    details: Mapping[str, Any] = field(default_factory=dict)
    replay: str | None = None    # the command that replays the run

    def __post_init__(self) -> None:
        if self.status not in _RANK:
            raise ValueError(f"verdict status must be one of {[s.value for s in Status]}, got "
                             f"{self.status!r}")
        object.__setattr__(self, "status", Status(self.status).value)  # a plain str
        object.__setattr__(self, "details", dict(self.details))

    @classmethod
    def passed(cls, check: str, message: str, **where: Any) -> "Verdict":
        return cls(PASS, check, message, **where)

    @classmethod
    def failed(cls, check: str, message: str, **where: Any) -> "Verdict":
        return cls(FAIL, check, message, **where)

    @classmethod
    def unknown(cls, check: str, message: str, **where: Any) -> "Verdict":
        return cls(UNKNOWN, check, message, **where)

    def where(self) -> str:
        """``step 12, rank 2, generation 1, after kill(rank:2) at step 12 backward``, or ''."""
        parts = [f"{name} {value}" for name, value in
                 (("step", self.step), ("rank", self.rank), ("generation", self.generation))
                 if value is not None]
        if self.fault:
            parts.append(f"fault {self.fault}")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        where = self.where()
        text = f"{self.status.upper()} {self.check}: {self.message}"
        if where:
            text += f" [{where}]"
        if self.replay and self.status != PASS:
            text += f" (replay: {self.replay})"
        return text


def combine(verdicts: Iterable[Verdict], check: str = "all") -> Verdict:
    """One verdict for many, with the priority fail > unknown > pass.

    The result takes its status and location from the first of the worst verdicts; its message
    lists every verdict that did not pass. No verdicts at all is ``unknown``: nothing was checked.
    """
    vs = list(verdicts)
    if not vs:
        return Verdict.unknown(check, "no checks ran")
    worst = max(vs, key=lambda v: _RANK[v.status])  # max keeps the first of equals
    bad = [v for v in vs if v.status != PASS]
    if not bad:
        message = f"all {len(vs)} checks passed ({', '.join(v.check for v in vs)})"
    else:
        bad.sort(key=lambda v: -_RANK[v.status])
        message = "; ".join(f"{v.check} {v.status}: {v.message}" for v in bad)
    return Verdict(worst.status, check, message, step=worst.step, rank=worst.rank,
                   generation=worst.generation, fault=worst.fault,
                   details={"verdicts": [v.to_dict() for v in vs]},
                   replay=next((v.replay for v in vs if v.replay), None))
