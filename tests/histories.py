"""A compact builder of recorded histories, for checker tests without processes.

    b = Builder(steps=20, world_size=2)
    b.gen(run=range(0, 13), cause="reshard", planned=True, fault_id=0, saves={12: DIGEST})
    b.gen(world_size=3, resume=13, run=range(13, 20), load=(12, DIGEST))
    history = b.history()

Defaults model a correct data-parallel job: the loss is a function of the step only, and step s
consumes the global batch ``s*BATCH .. s*BATCH+BATCH-1``, split across ranks by ``rank::world``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from pytest_reshard.history import History

BATCH = 4
DIGEST = {"model": "aaaa", "optimizer": "bbbb", "data": "cccc"}


def default_loss(step: int) -> float:
    return 2.0 / (1.0 + 0.1 * step)


def default_samples(step: int, rank: int, world: int) -> list[int]:
    return list(range(step * BATCH, (step + 1) * BATCH))[rank::world]


class Builder:
    def __init__(self, *, steps: int = 20, world_size: int = 2, seed: int = 0,
                 faults: Sequence[Mapping[str, Any]] = (), scenario: bool = True) -> None:
        self.world_size = world_size
        self.events: list[dict[str, Any]] = []
        self.t = 1000.0
        self.next_gen = 0
        if scenario:
            self.sup("scenario", workload="lm", steps=steps, world_size=world_size, seed=seed,
                     schedule={"seed": seed, "faults": [dict(f) for f in faults]},
                     schedule_hash="abc123", replay="pytest-reshard replay run-1")

    def _tick(self) -> float:
        self.t += 0.01
        return self.t

    def sup(self, ev: str, **fields: Any) -> None:
        self.events.append({"ev": ev, "t": self._tick(), **fields})

    def rank(self, gen: int, rank: int, ev: str, **fields: Any) -> None:
        self.events.append({"ev": ev, "t": self._tick(), "gen": gen, "rank": rank, **fields})

    def gen(self, *, world_size: int | None = None, resume: int | None = 0,
            run: Iterable[int] = (), partial: Mapping[int, Iterable[int]] | None = None,
            cause: str | None = "complete", planned: bool = False, fault_id: int | None = None,
            max_rewind: int | None = None, roles: Sequence[str] | None = None,
            loss: Callable[[int], float | None] = default_loss,
            samples: Callable[[int, int, int], list[int] | None] = default_samples,
            saves: Mapping[int, Mapping[str, str]] | None = None,
            load: tuple[int, Mapping[str, str]] | None = None,
            load_expected: Mapping[str, str] | None = None,
            fault: Mapping[str, Any] | None = None, started: Iterable[int] | None = None,
            source: str = "checkpoint") -> int:
        """Add a generation: every rank runs and ends the steps in ``run``.

        ``partial={step: ranks}``: the step begins on every rank but only ``ranks`` end it.
        ``saves={step: digest}``: rank 0 saves that digest after the step (others: empty).
        ``fault``: a fault event ``{rank, step, phase, kind, id}`` fired on that rank.
        """
        g = self.next_gen
        self.next_gen += 1
        world = world_size or self.world_size
        roles = list(roles or ["trainer"] * world)
        self.sup("gen_start", gen=g, world_size=world, roles=roles, launcher="local")
        starters = list(range(world)) if started is None else list(started)
        for r in starters:
            self.rank(g, r, "start", world_size=world, role=roles[r], pid=100 + r,
                      max_rewind_steps=max_rewind)
        if load is not None:
            for r in starters:
                self.rank(g, r, "ckpt_load", step=load[0], digest=dict(load[1]) if r == 0 else {},
                          **({"expected": dict(load_expected)} if load_expected else {}))
        if resume is not None:
            for r in starters:
                self.rank(g, r, "resumed", step=resume,
                          source="fresh" if resume == 0 else source)
        steps = sorted(set(run) | set(partial or {}))
        for s in steps:
            enders = set(starters) if s not in (partial or {}) else set(partial[s])
            for r in starters:
                self.rank(g, r, "begin", step=s)
                ids = samples(s, r, world)
                if ids is not None:
                    self.rank(g, r, "record", step=s, samples=ids)
                if fault and fault["rank"] == r and fault["step"] == s:
                    self.rank(g, r, "fault", step=s, phase=fault["phase"], kind=fault["kind"],
                              id=fault.get("id"), params=fault.get("params", {}))
                if r in enders:
                    value = loss(s)
                    if value is not None:
                        self.rank(g, r, "record", step=s, loss=value)
                    self.rank(g, r, "end", step=s)
            if saves and s in saves:
                for r in starters:
                    self.rank(g, r, "ckpt_save", step=s, digest=dict(saves[s]) if r == 0 else {})
        if cause is not None:
            self.sup("gen_end", gen=g, cause=cause, planned=planned, fault_id=fault_id, detail="")
        return g

    def detect(self, gen: int, kind: str, rank: int, step: int | None, phase: str | None, *,
               expected: bool, exit_code: int | None = None) -> None:
        self.sup("detect", gen=gen, kind=kind, rank=rank, step=step, phase=phase,
                 exit_code=exit_code, latency_s=0.1, expected=expected)

    def history(self) -> History:
        return History.from_events(self.events)

    def write(self, run_dir: Path) -> Path:
        """Write the events as the probe and supervisor would: one file per rank per generation."""
        events = run_dir / "events"
        events.mkdir(parents=True)
        for e in self.events:
            name = (f"g{e['gen']}-r{e['rank']}.jsonl" if "rank" in e and e["ev"] != "detect"
                    else "supervisor.jsonl")
            with open(events / name, "a") as f:
                f.write(json.dumps(e) + "\n")
        return run_dir


def reshard_run(*, steps: int = 20, at: int = 12, to: int = 3, **second: Any) -> Builder:
    """A correct planned reshard 2 -> ``to`` ranks after step ``at``; ``second`` overrides gen 1."""
    b = Builder(steps=steps, faults=[{"kind": "shift_shards", "target": "all", "step": at,
                                      "phase": "optimizer",
                                      "params": {"to_world_size": to, "notice_s": 1}}])
    b.gen(run=range(0, at + 1), cause="reshard", planned=True, fault_id=0, saves={at: DIGEST},
          fault={"rank": 0, "step": at, "phase": "optimizer", "kind": "shift_shards", "id": 0})
    kwargs: dict[str, Any] = dict(world_size=to, resume=at + 1, run=range(at + 1, steps),
                                  load=(at, DIGEST))
    kwargs.update(second)
    b.gen(**kwargs)
    return b


def clean_run(*, steps: int = 20, world_size: int = 2,
              loss: Callable[[int], float | None] = default_loss) -> History:
    b = Builder(steps=steps, world_size=world_size)
    b.gen(run=range(steps), loss=loss)
    return b.history()
