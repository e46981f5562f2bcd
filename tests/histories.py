"""A compact builder of recorded histories, for checker tests without processes.

    b = Builder(steps=20, world_size=2)
    b.gen(run=range(0, 13), cause="reshard", planned=True, fault_id=0, saves={12: DIGEST})
    b.gen(world_size=3, resume=13, run=range(13, 20), load=(12, DIGEST))
    history = b.history()

Defaults model a correct data-parallel job: the loss is a function of the step only, and step s
consumes the global batch ``s*BATCH .. s*BATCH+BATCH-1``, split across ranks by ``rank::world``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from pytest_reshard.contract import SUPERVISOR_EVENTS, RunDir, encode_event
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
        folder = RunDir(run_dir)
        folder.events.mkdir(parents=True)
        for e in self.events:
            path = (folder.rank_events(e["gen"], e["rank"]) if e["ev"] not in SUPERVISOR_EVENTS
                    else folder.supervisor_events)
            with open(path, "ab") as f:
                f.write(encode_event(e))
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


def membership_run(*, steps: int = 12, kill_at: int = 4, heal_at: int | None = None,
                   heal_digest: Mapping[str, str] | None = None, rejoin_from: int | None = None,
                   max_rewind: int = 0) -> Builder:
    """A membership-mode generation of 2 replica groups x 1 rank (torchft-like), correct by
    default: group 1 (rank 1) is killed in step ``kill_at``; rank 0's attempt at that step is not
    committed; the harness restarts group 1, which heals from rank 0 (the donor saves, the healer
    loads ``DIGEST``) into step ``heal_at``, and both groups train on to the end.

    ``heal_at > kill_at``: rank 0 commits steps ``kill_at .. heal_at - 1`` alone (a quorum of
    one: ``participants=1``). ``heal_digest``: what the healer loads instead (a heal that did not
    apply the state). ``rejoin_from``: the restarted group does not heal, it trains again from
    that step (its own older state) while rank 0 goes on."""
    heal_at = kill_at if heal_at is None else heal_at
    b = Builder(steps=steps, faults=[{"kind": "kill", "target": "rank:1", "step": kill_at,
                                      "phase": "backward", "params": {}}])
    b.sup("member", action="groups", groups=2, per=1, member_restarts=3)
    b.sup("gen_start", gen=0, world_size=2, roles=["trainer", "trainer"], launcher="fork")

    def attempt(rank: int, s: int, *, participants: int = 2, end: bool = True,
                fault: bool = False) -> None:
        b.rank(0, rank, "begin", step=s)
        b.rank(0, rank, "record", step=s, samples=default_samples(s, rank, 2),
               quorum=1 if participants == 2 else 2, participants=participants)
        if fault:
            b.rank(0, rank, "fault", step=s, phase="backward", kind="kill", id=0, params={})
            return
        if end:
            b.rank(0, rank, "record", step=s, loss=default_loss(s))
            b.rank(0, rank, "end", step=s)
        else:
            b.rank(0, rank, "error", step=s, phase="optimizer", error="not committed by the quorum")

    for r in (0, 1):
        b.rank(0, r, "start", world_size=2, role="trainer", pid=100 + r, max_rewind_steps=max_rewind)
        b.rank(0, r, "resumed", step=0, source="fresh")
    for s in range(kill_at):
        attempt(0, s)
        attempt(1, s)
    attempt(1, kill_at, fault=True)
    attempt(0, kill_at, end=False)
    b.detect(0, "died", 1, kill_at, "backward", expected=True, exit_code=-9)
    b.sup("member", action="restart", gen=0, group=1, ranks=[1], incarnation="0.1",
          cause="rank 1 died", codes={"1": -9}, killed_t=b.t, restart=1)
    for s in range(kill_at, heal_at):
        attempt(0, s, participants=1)
    b.rank(0, 1, "start", world_size=2, role="trainer", pid=200, max_rewind_steps=max_rewind)
    b.rank(0, 1, "resumed", step=0, source="fresh")
    if rejoin_from is not None:
        for s in range(rejoin_from, steps):
            attempt(1, s)
        for s in range(heal_at, steps):
            attempt(0, s)
    else:
        b.rank(0, 0, "ckpt_save", step=heal_at - 1, digest=dict(DIGEST), source="torchft-heal-donor")
        b.rank(0, 1, "ckpt_load", step=heal_at - 1, digest=dict(heal_digest or DIGEST),
               source="torchft-heal")
        for s in range(heal_at, steps):
            attempt(0, s)
            attempt(1, s)
    for r in (0, 1):
        b.rank(0, r, "exit", code=0)
    b.sup("gen_end", gen=0, cause="complete", planned=False, fault_id=None, detail="")
    return b
