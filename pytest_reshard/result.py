"""The result of one scenario: its history, each checker's verdict, and assertions over them."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pytest_reshard.history import History
from pytest_reshard.supervisor import Scenario
from pytest_reshard.verdict import Verdict, combine


class ReshardAssertionError(AssertionError):
    """A checker failed (or could not decide); the message names step, rank, fault and replay."""


@dataclass
class Result:
    name: str
    scenario: Scenario
    run_dir: Path
    history: History
    verdicts: dict[str, Verdict]
    wall_s: float
    replay: str
    report: Path | None = None   # report.html, once written

    @property
    def verdict(self) -> Verdict:
        """All checks combined: fail > unknown > pass."""
        return combine(list(self.verdicts.values()))

    def save(self) -> None:
        """verdict.json and replay.txt beside the history, for CI artifacts."""
        data = {"name": self.name, "schedule_hash": self.scenario.schedule.hash,
                "schedule": self.scenario.schedule.describe(), "wall_s": round(self.wall_s, 3),
                "status": self.verdict.status, "replay": self.replay,
                "checks": {k: v.to_dict() for k, v in self.verdicts.items()}}
        (self.run_dir / "verdict.json").write_text(json.dumps(data, indent=2))
        (self.run_dir / "replay.txt").write_text(self.replay + "\n")

    def _assert(self, *checks: str, allow_unknown: bool = False) -> None:
        bad = [self.verdicts[c] for c in checks
               if self.verdicts[c].status == "fail"
               or (self.verdicts[c].status == "unknown" and not allow_unknown)]
        if bad:
            lines = [f"{v.check} {v.status.upper()}: {v.message}" for v in bad]
            raise ReshardAssertionError(
                "\n".join(lines) + f"\n  scenario: {self.scenario.workload} world_size="
                f"{self.scenario.world_size} faults: {self.scenario.schedule.describe()}"
                f"\n  schedule {self.scenario.schedule.hash}, artifacts: {self.run_dir}"
                + (f"\n  report: {self.report}" if self.report else "")
                + f"\n  replay: {self.replay}")

    def assert_no_rewind(self) -> None:
        """No committed step was executed again beyond the workload's declared budget."""
        self._assert("no_rewind")

    def assert_loss_continuous(self) -> None:
        """Per-step loss matches a clean reference run within the measured noise floor."""
        self._assert("loss_continuity")

    def assert_exactly_once(self) -> None:
        """Every sample was consumed exactly once across generations."""
        self._assert("exactly_once_samples")

    def assert_state_equivalent(self) -> None:
        """The state loaded after each reshard equals the state saved before it, bit for bit."""
        self._assert("state_equivalence")

    def assert_live(self) -> None:
        """The run finished; no rank died, stopped or vanished without a scheduled fault."""
        self._assert("liveness")

    def assert_sample_ledger(self) -> None:
        """Across a pipeline's queue, every step's consumers took exactly what its producers made."""
        self._assert("sample_ledger")

    def assert_throughput(self) -> None:
        """No generation ran below ``min_throughput`` of a clean run's tokens/s, and no rank of a
        role sat idle while the others worked (a pool that silently shrank)."""
        self._assert("throughput")

    def assert_memory_headroom(self) -> None:
        """No rank came within the margin of the scenario's memory budget."""
        self._assert("memory_headroom")

    def assert_ok(self, *, allow_unknown: bool = False) -> None:
        """Every default checker passed."""
        self._assert(*self.verdicts, allow_unknown=allow_unknown)
