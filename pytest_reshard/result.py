"""The result of one scenario: its history, each checker's verdict, and assertions over them.

``assert_ok()`` asserts every verdict; each registered checker adds its own ``assert_*`` method
(``checkers.registry``): ``assert_no_rewind``, ``assert_loss_continuous``, ``assert_exactly_once``,
``assert_state_equivalent``, ``assert_live``, ``assert_no_poisoned_commit``,
``assert_sample_ledger``, ``assert_throughput``, ``assert_memory_headroom``,
``assert_allocator_unfragmented``, and a user's ``assert_<name>``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from pytest_reshard.contract import RunDir
from pytest_reshard import checkers
from pytest_reshard.history import History
from pytest_reshard.supervisor import Scenario
from pytest_reshard.verdict import FAIL, PASS, UNKNOWN, Verdict, combine


class ReshardAssertionError(AssertionError):
    """A checker failed (or could not decide); the message names step, rank, fault and replay."""


class CheckerDidNotRun(ReshardAssertionError):
    """An assertion on a checker that did not apply to this scenario (so it has no verdict)."""


@dataclass
class Result:
    name: str
    scenario: Scenario
    run_dir: Path
    history: History
    verdicts: dict[str, Verdict]
    wall_s: float | None         # the run's wall time; None: a recording, judged (not run) here
    replay: str
    report: Path | None = None   # report.html, once written

    @property
    def verdict(self) -> Verdict:
        """All checks combined: fail > unknown > pass."""
        return combine(list(self.verdicts.values()))

    def save(self) -> None:
        """verdict.json and replay.txt beside the history, for CI artifacts."""
        data = {"name": self.name, "schedule_hash": self.scenario.schedule.hash,
                "schedule": self.scenario.schedule.describe(),
                "wall_s": None if self.wall_s is None else round(self.wall_s, 3),
                "status": self.verdict.status, "replay": self.replay,
                "checks": {k: v.to_dict() for k, v in self.verdicts.items()}}
        folder = RunDir(self.run_dir)
        folder.verdict.write_text(json.dumps(data, indent=2))
        folder.replay.write_text(self.replay + "\n")

    @property
    def ok(self) -> bool:
        """Every verdict passed (what ``assert_ok()`` asserts)."""
        return all(v.status == PASS for v in self.verdicts.values())

    def _assert(self, *checks: str, allow_unknown: bool = False) -> None:
        bad = [self.verdicts[c] for c in checks
               if self.verdicts[c].status == FAIL
               or (self.verdicts[c].status == UNKNOWN and not allow_unknown)]
        if bad:
            lines = [f"{v.check} {v.status.upper()}: {v.message}" for v in bad]
            raise ReshardAssertionError("\n".join(lines) + self._context())

    def _context(self) -> str:
        """The lines under an assertion's message: scenario, schedule, artifacts, replay."""
        return (f"\n  scenario: {self.scenario.workload} world_size={self.scenario.world_size} "
                f"faults: {self.scenario.schedule.describe()}"
                f"\n  schedule {self.scenario.schedule.hash}, artifacts: {self.run_dir}"
                + (f"\n  report: {self.report}" if self.report else "")
                + f"\n  replay: {self.replay}")

    def assert_ok(self, *, allow_unknown: bool = False) -> None:
        """Every checker that ran passed (``allow_unknown=True``: or could not decide)."""
        self._assert(*self.verdicts, allow_unknown=allow_unknown)

    # -- one assertion per registered checker -------------------------------------------------
    def __getattr__(self, name: str) -> Callable[..., None]:
        """``assert_<...>`` of a registered checker (``assert_no_rewind``, ``assert_live``, a
        user's ``assert_eval_metric``), resolved through ``pytest_reshard.checkers``."""
        if not name.startswith("assert_"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        checker = checkers.by_assertion(name)
        verdicts = self.__dict__.get("verdicts", {})
        if checker is None and name[len("assert_"):] not in verdicts:
            known = sorted(c.assertion for c in checkers.registered())
            raise AttributeError(f"Result has no {name}: no registered checker asserts it; the "
                                 f"checkers' assertions are {', '.join(known)} (and assert_ok)")
        check = checker.name if checker is not None else name[len("assert_"):]
        return _Assertion(self, name, check, checker)

    def __dir__(self) -> Iterable[str]:
        names = set(super().__dir__()) | {c.assertion for c in checkers.registered()}
        return sorted(names | {f"assert_{c}" for c in self.__dict__.get("verdicts", {})
                               if checkers.get(c) is None})


class _Assertion:
    """``result.assert_<checker>(allow_unknown=False)``: that checker's verdict passed."""

    def __init__(self, result: Result, name: str, check: str,
                 checker: "checkers.Checker | None") -> None:
        self.result, self.check, self.checker = result, check, checker
        self.__name__ = self.__qualname__ = name
        what = checker.description if checker is not None else f"the {check} check passed"
        when = f" Runs when {checker.when}." if checker is not None and checker.when != "always" \
            else ""
        self.__doc__ = (f"Assert the {check} checker passed: {what}.{when} Fails on fail, and on "
                        "unknown unless allow_unknown=True.")

    def __call__(self, *, allow_unknown: bool = False) -> None:
        r = self.result
        if self.check not in r.verdicts:
            when = (f"it applies when {self.checker.when}" if self.checker is not None
                    else "it is not registered in this process")
            raise CheckerDidNotRun(
                f"{self.__name__}(): the {self.check} checker did not run for this scenario: "
                f"{when}. The checkers that ran: {', '.join(r.verdicts) or 'none'}"
                + r._context())
        r._assert(self.check, allow_unknown=allow_unknown)

    def __repr__(self) -> str:
        return f"<assertion {self.__name__} of {self.result.name}>"
