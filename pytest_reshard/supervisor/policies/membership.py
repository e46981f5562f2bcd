"""Membership mode (``Scenario.replica_groups=G``): a death ends one replica group, not the
generation, because fault-tolerant trainers (torchft) train on with the groups left and heal a
restarted group from a live peer.

The dead rank's group (ranks ``g * per .. g * per + per - 1``) is killed and started again into
the running generation through the same launcher, with ``TORCHFT_REJOIN=1`` and a new
``TORCHFT_INCARNATION``, at most ``member_restarts`` times per generation and after
``member_restart_delay_s`` (the quorum trains on without it meanwhile). A preemption of some
groups is theirs alone. The generation's plan is rewritten without the faults that fired, so a
restarted rank does not fire them again; the history tells incarnations apart by their ``start``
events. The Lighthouse (``Scenario.lighthouse``) must outlive every group, so the supervisor
hosts it for the whole run.
"""
from __future__ import annotations

import json
import signal
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

from pytest_reshard.contract import Cause, Detected, Ev, MemberAction, write_json
from pytest_reshard.schedule import kinds
from pytest_reshard.supervisor import launch
from pytest_reshard.supervisor.launch import KILL_WAIT_S, LiveGeneration, RankSpec, wait_until
from pytest_reshard.supervisor.outcome import Outcome
from pytest_reshard.supervisor.policies.relaunch import Relaunch

if TYPE_CHECKING:  # pragma: no cover
    from pytest_reshard.contract import RunDir
    from pytest_reshard.supervisor.scenario import Scenario
    from pytest_reshard.supervisor.watch import Watch

__all__ = ["Membership", "MemberGeneration", "check_scenario"]

#: The Lighthouse's settings unless the scenario says otherwise: a quorum of one may form (the
#: survivors train on), and a silent group is dead after 1 s (torchft's default is 5 s).
LIGHTHOUSE_DEFAULTS = {"min_replicas": 1, "join_timeout_ms": 10000, "quorum_tick_ms": 100,
                       "heartbeat_timeout_ms": 1000}


def check_scenario(sc: "Scenario") -> None:
    """Reject a membership scenario that cannot mean what its author wants."""
    g = sc.replica_groups
    if g is None:
        if sc.lighthouse is not None:
            raise ValueError("lighthouse= needs replica_groups=G (membership mode): a Lighthouse "
                             "outside the groups matters only when groups restart alone")
        return
    if g < 1 or sc.world_size % g:
        raise ValueError(f"replica_groups={g} must divide world_size={sc.world_size} (each group "
                         "has world_size / G ranks)")
    if not getattr(launch.launcher_class(sc.launcher), "restarts_groups", False):
        able = [n for n in launch.registered()
                if getattr(launch.launcher_class(n), "restarts_groups", False)]
        raise ValueError(f"replica_groups needs launcher={' or '.join(map(repr, able))} (it "
                         f"relaunches one group through the launcher), not {sc.launcher!r}")
    unknown = set(sc.lighthouse or {}) - set(LIGHTHOUSE_DEFAULTS)
    if unknown:
        raise ValueError(f"lighthouse: unknown settings {sorted(unknown)}; known: "
                         f"{sorted(LIGHTHOUSE_DEFAULTS)}")
    if sc.member_restart_delay_s < 0:
        raise ValueError(f"member_restart_delay_s must be >= 0, got {sc.member_restart_delay_s}")


class MemberGeneration(LiveGeneration):
    """One generation's ranks when groups restart alone: each rank is answered by the launch
    that started its latest incarnation."""

    def __init__(self, first: LiveGeneration, ranks: Sequence[int]) -> None:
        self.lives = [first]
        self.owner = {r: first for r in ranks}

    def _ranks_of(self, live: LiveGeneration) -> list[int]:
        return [r for r, o in self.owner.items() if o is live]

    def pids(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for live in self.lives:
            pids = live.pids()
            out.update({r: pids[r] for r in self._ranks_of(live) if r in pids})
        return out

    def exit_codes(self) -> dict[int, int | None]:
        out: dict[int, int | None] = {}
        for live in self.lives:
            mine = self._ranks_of(live)
            if mine:
                codes = live.exit_codes()
                out.update({r: codes.get(r) for r in mine})
        return dict(sorted(out.items()))

    def signal(self, rank: int, sig: int) -> None:
        self.owner[rank].signal(rank, sig)

    def kill(self) -> None:
        for live in self.lives:
            live.kill()

    def state(self, rank: int, pid: int | None) -> str | None:
        return self.owner[rank].state(rank, pid)

    def peak_rss(self, rank: int, pid: int | None) -> int | None:
        return self.owner[rank].peak_rss(rank, pid)

    def last_beat(self, rank: int) -> float | None:
        return self.owner[rank].last_beat(rank)

    def deliver(self, fault: dict[str, Any]) -> float | None:
        return self.lives[0].deliver(fault)

    def adopt(self, live: LiveGeneration, ranks: Sequence[int]) -> None:
        self.lives.append(live)
        self.owner.update({r: live for r in ranks})


class Membership(Relaunch):
    """The supervisor's side of membership mode for a whole run (the Lighthouse, the restart
    budget, the relaunch of one group) and the policy of each of its generations."""

    def __init__(self, scenario: "Scenario", run_dir: "RunDir", record: Callable[..., None],
                 launcher: Any) -> None:
        check_scenario(scenario)
        self.sc, self.dir, self.record, self.launcher = scenario, run_dir, record, launcher
        self.groups = int(scenario.replica_groups or 1)
        self.per = scenario.world_size // self.groups
        self.lighthouse: Any = None
        self.address: str | None = None
        record(Ev.MEMBER, action=MemberAction.GROUPS, groups=self.groups, per=self.per,
               member_restarts=scenario.member_restarts)
        if scenario.lighthouse is not None:
            from torchft._torchft import LighthouseServer  # only when asked: torchft is optional

            opts = {**LIGHTHOUSE_DEFAULTS, **scenario.lighthouse}
            # loopback only (its ranks run on this machine; it has no authentication), and an
            # address that says so: ``address()`` names the host, which may resolve elsewhere
            self.lighthouse = LighthouseServer(bind="127.0.0.1:0", **opts)
            self.address = f"http://127.0.0.1:{self.lighthouse.address().rsplit(':', 1)[1]}"
            record(Ev.MEMBER, action=MemberAction.LIGHTHOUSE, address=self.address, **opts)
        self.gen = -1
        self.specs: dict[int, RankSpec] = {}
        self.restarts: dict[int, int] = {}  # group -> restarts in this generation
        self.incarnation = 0
        self.pending: dict[int, tuple[float, list[RankSpec]]] = {}  # group -> (due, its specs)
        self.preempted: dict[int, tuple[int, float]] = {}  # group -> (fault id, grace deadline)
        self.fault_ranks: dict[int, list[int]] = {}  # fault id -> the ranks it targets (the plan)

    @classmethod
    def of(cls, scenario: "Scenario", run_dir: "RunDir", record: Callable[..., None],
           launcher: Any) -> "Membership | None":
        return cls(scenario, run_dir, record, launcher) if scenario.replica_groups else None

    def group_of(self, rank: int) -> list[int]:
        return self._ranks(rank // self.per)

    def launch(self, gen: int, specs: Sequence[RankSpec]) -> MemberGeneration:
        """Start generation ``gen``'s ranks, with what membership mode tells them."""
        self.gen, self.restarts, self.pending, self.preempted = gen, {}, {}, {}
        for s in specs:
            s.env.update(self._env(gen, str(gen)))
        self.specs = {s.rank: s for s in specs}
        plan = json.loads(self.dir.plan(gen).read_text())
        self.fault_ranks = {int(f["id"]): list(f["ranks"]) for f in plan["faults"]}
        return MemberGeneration(self.launcher.launch(specs), [s.rank for s in specs])

    def _env(self, gen: int, incarnation: str) -> dict[str, str]:
        env = {"TORCHFT_MEMBERSHIP": "1", "TORCHFT_INCARNATION": incarnation,
               "NUM_REPLICA_GROUPS": str(self.groups)}
        if self.address:
            env["TORCHFT_LIGHTHOUSE"] = self.address
        return env

    def down(self, rank: int) -> bool:
        """The rank's group is down, or being preempted: its exits are the restart's to handle."""
        return rank // self.per in self.pending

    def preempt(self, fault: dict[str, Any], grace_s: float) -> bool:
        """A planned preemption fired: True when it is one group's (the ranks it targets cover
        some groups, not all), which then exits on its own grace while the others train on."""
        groups = {r // self.per for r in self.fault_ranks.get(int(fault["id"]), ())}
        if not groups or len(groups) == self.groups:
            return False
        for g in groups:
            self.preempted.setdefault(g, (int(fault["id"]), time.monotonic() + grace_s))
        self.record(Ev.MEMBER, action=MemberAction.PREEMPT, gen=self.gen, groups=sorted(groups),
                    fault_id=fault["id"], grace_s=grace_s)
        return True

    def poll(self) -> bool:
        """Each watch poll: a preempted group past its grace is killed (as a scheduler would),
        and a group whose restart delay is over is started again (then True)."""
        if not self.preempted and not self.pending:
            return False
        now = time.monotonic()
        live = self.loop.live
        assert isinstance(live, MemberGeneration)
        codes = live.exit_codes()
        for g, (fault_id, deadline) in self.preempted.items():
            alive = [r for r in self._ranks(g) if codes.get(r) is None]
            if now > deadline and alive:
                self.record(Ev.MEMBER, action=MemberAction.GRACE_EXPIRED, gen=self.gen, group=g, ranks=alive,
                            fault_id=fault_id)
                for r in alive:
                    live.signal(r, signal.SIGKILL)
        started = False
        for g, (due, specs) in list(self.pending.items()):
            if now >= due:
                started = True
                del self.pending[g]
                for s in specs:  # the dead process's last beat is not the new one's
                    self.dir.heartbeat(self.gen, s.rank).unlink(missing_ok=True)
                live.adopt(self.launcher.launch(specs), [s.rank for s in specs])
                self.loop.revive([s.rank for s in specs])
        return started

    def drop_pending(self, why: str) -> list[int]:
        """The run is over while groups are down: they are not started again. Their ranks."""
        ranks = sorted(r for _, specs in self.pending.values() for r in (s.rank for s in specs))
        for g in sorted(self.pending):
            self.record(Ev.MEMBER, action=MemberAction.DROPPED, gen=self.gen, group=g, ranks=self._ranks(g),
                        detail=why)
        self.pending.clear()
        return ranks

    def _ranks(self, g: int) -> list[int]:
        return list(range(g * self.per, (g + 1) * self.per))

    def may_restart(self, rank: int) -> bool:
        """Whether ``rank``'s group has restarts left in this generation (recorded when not)."""
        g = rank // self.per
        if self.restarts.get(g, 0) < self.sc.member_restarts:
            return True
        self.record(Ev.MEMBER, action=MemberAction.EXHAUSTED, gen=self.gen, group=g, ranks=self.group_of(rank),
                    detail=f"group {g} was restarted {self.sc.member_restarts} times in generation "
                           f"{self.gen} already (member_restarts): this death ends the generation")
        return False

    def restart(self, rank: int, cause: str) -> None:
        """Kill the rest of ``rank``'s group, then start the whole group again into the running
        generation (``may_restart`` said it may)."""
        watch = self.loop
        live = watch.live
        assert isinstance(live, MemberGeneration)
        ranks = self.group_of(rank)
        g = rank // self.per
        killed_at = time.time()
        for r in ranks:
            if r != rank and live.exit_codes().get(r) is None:
                live.signal(r, signal.SIGKILL)
        wait_until(lambda: all(live.exit_codes().get(r) is not None for r in ranks),
                   KILL_WAIT_S, f"a rank of group {g} ({ranks})")
        codes = live.exit_codes()
        self.restarts[g] = self.restarts.get(g, 0) + 1
        self.incarnation += 1
        incarnation = f"{self.gen}.{self.incarnation}"
        watch.tail.poll(self.gen)  # what the group fired before it died: not to be fired again
        watch.take_events()
        self._replan(watch.fired)
        specs = []
        for r in ranks:
            base = self.specs[r]
            env = {**base.env, **self._env(self.gen, incarnation), "TORCHFT_REJOIN": "1"}
            specs.append(RankSpec(rank=r, argv=base.argv, env=env, cwd=base.cwd, log=base.log))
        preempted = self.preempted.pop(g, None)
        delay = self.sc.member_restart_delay_s
        self.record(Ev.MEMBER, action=MemberAction.RESTART, gen=self.gen, group=g, ranks=ranks,
                    incarnation=incarnation, cause=cause, codes={str(r): codes[r] for r in ranks},
                    killed_t=killed_at, restart=self.restarts[g], delay_s=delay,
                    **({"fault_id": preempted[0]} if preempted else {}))
        self.pending[g] = (time.monotonic() + delay, specs)
        watch.settle(ranks)  # down until poll starts them again
        self.poll()

    def _replan(self, fired: dict[int, dict]) -> None:
        """Drop the faults that fired from the generation's plan (atomically): the restarted
        ranks read it at attach; the running ones read it long ago."""
        path = self.dir.plan(self.gen)
        plan = json.loads(path.read_text())
        plan["faults"] = [f for f in plan["faults"] if f["id"] not in fired]
        write_json(path, plan, indent=1)

    # -- the generation's policy ----------------------------------------------------------------
    def start(self, loop: Watch) -> None:
        self.loop = loop
        self.down_at_end: list[int] = []  # ranks whose group was down when the others finished

    def on_fault(self, ev: dict[str, Any], declared: kinds.FaultKind) -> bool:
        """A preemption of some groups is theirs, not the generation's."""
        if declared.cause is not Cause.PREEMPT:
            return False
        return self.preempt(ev, float(ev["params"][declared.deadline_param]))

    def on_death(self, rank: int, code: int | None, normal: bool) -> bool:
        """Restart the rank's replica group alone (the others train on); False when its restart
        budget is spent, and the death then ends the generation."""
        loop = self.loop
        if self.down(rank) or loop.live.exit_codes().get(rank) is None:
            loop.settle([rank])  # down already, or restarted in this poll (a stale code)
            return True
        group = self.group_of(rank)
        if rank // self.per in self.preempted:  # planned: no detection
            codes = loop.live.exit_codes()
            if any(codes.get(r) is None for r in group):
                loop.settle([rank])  # its peers still use their grace: restart them together
                return True
            if not self.may_restart(rank):
                return False
            detail = f"rank {rank} ended by its group's preemption (exit code {code})"
        else:
            if not self.may_restart(rank):
                return False
            kind = Detected.EXITED_EARLY if normal else Detected.DIED
            fault = loop.fault_for(rank, kinds.Ending.DEATH)
            detail = loop.detect(kind, rank, expected=fault is not None, code=code,
                                 since=fault["t"] if fault else None)
        self.restart(rank, detail)
        return True

    def on_all_exited(self, codes: dict[int, int | None]) -> bool:
        """Over, unless a group is down for a restart while the others have not finished (every
        group down: the restart delay runs, then ``poll`` starts them)."""
        if not self.pending:
            return True
        if self.loop.finished({r: c for r, c in codes.items() if not self.down(r)}):
            self.down_at_end = self.drop_pending(
                "the other groups finished the run while this one was down")
            return True
        return False

    def outcome(self, codes: dict[int, int | None]) -> Outcome:
        return self.judge(codes, excused=self.down_at_end)

    def close(self) -> None:
        if self.lighthouse is not None:
            self.lighthouse.shutdown()
            self.lighthouse = None
