"""The supervisor owns one scenario: it runs generations of ranks until the run completes or fails.

For each generation it writes the fault plan (which ranks fire which fault at which point),
launches the ranks, then watches them every 20 ms:

- exits (a death is seen within one poll, about 20 ms after the process is gone);
- heartbeats: a live rank whose heartbeat file is older than ``hang_s`` is *stopped* (SIGSTOP,
  a wedged interpreter); the verdict names its last step and phase;
- progress: no event from any rank for ``stall_s`` once training started is a *stall*
  (a deadlocked collective that gloo would only notice after its timeout);
- deadlines: a reshard notice or a preemption's grace period that expires with ranks still
  alive ends the generation with SIGKILL, as a real scheduler would.

What a generation does about deaths and planned ends is its policy's (``supervisor/policies``):
relaunch by default, restart one replica group in membership mode, and, when the ranks ask to
reshard in place (``run.live_reshard``), keep the survivors as the next generation and start only
the ranks that join (``_go_live``).

It records what it saw to ``events/supervisor.jsonl`` (the harness's half of the history), and
every process it started is gone when ``run`` returns, whether it succeeds, fails, times out or
is interrupted.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from pytest_reshard import filewatch
from pytest_reshard.contract import (Cause, Env, Ev, FileKill, RunDir, encode_event, name_of,
                                     write_json)
from pytest_reshard.schedule import kinds, resolve_target
from pytest_reshard.supervisor import devices, launch, power
from pytest_reshard.supervisor.launch import LiveGeneration, RankSpec, Regrouped, free_port
from pytest_reshard.supervisor.policies.in_place import InPlace
from pytest_reshard.supervisor.policies.membership import Membership
from pytest_reshard.supervisor.policies.relaunch import Relaunch
from pytest_reshard.supervisor.scenario import Scenario, next_roles
from pytest_reshard.supervisor.outcome import REFUSED_WRITE, HarnessError
from pytest_reshard.supervisor.tail import EventTail
from pytest_reshard.supervisor.watch import Outcome, Watch, WatchContext
from pytest_reshard.workloads import resolve

__all__ = ["Supervisor"]


class Supervisor:
    #: Called with a ``progress.Status`` after each batch of events (the live progress line).
    on_status: Callable[[Any], None] | None = None

    def __init__(self, scenario: Scenario, run_dir: Path, *,
                 progress: Callable[[str], None] | None = None,
                 launcher: Any | None = None) -> None:
        self.scenario = scenario
        self.dir = RunDir(Path(run_dir))
        self.run_dir = self.dir.root
        for d in (self.dir.events, self.dir.logs, self.dir.work):
            d.mkdir(parents=True, exist_ok=True)
        self.tail = EventTail(self.dir)
        self._progress = progress or (lambda msg: None)
        self._sup = open(self.dir.supervisor_events, "a")
        workload = resolve(scenario.workload)
        self.argv = workload.argv(scenario.steps, scenario.args)
        self._own_launcher = launcher is None
        self.launcher = launcher or launch.make(scenario.launcher, launch.LaunchContext(
            preload=workload.preloads(), pid_of=self.tail.pids, clean_exit=self.tail.clean_exit,
            scenario=scenario, note=self._note))
        self.fired: dict[int, dict] = {}  # fault id -> the fault event that fired it
        self.device_map: list[int] | None = None  # rank -> device, set by a rebalance
        #: each rank's device class in a heterogeneous world, and their CPU caps
        self.devices = list(scenario.devices) if scenario.devices else None
        self.throttle = devices.Throttle(scenario.schedule.hash, scenario.throttle) \
            if self.devices else None
        self._live: LiveGeneration | None = None
        #: A live reshard's next generation: its processes, its store, its gen_start record.
        self._next: tuple[LiveGeneration, Any, dict[str, Any]] | None = None
        self._unformed: dict[str, Any] | None = None  # the gen_start of a next world that failed
        # replica_groups: a death restarts only its group (supervisor/policies/membership.py)
        self.members = Membership.of(scenario, self.dir, self.record, self.launcher)

    # -- recording -------------------------------------------------------------------------
    def record(self, ev: str, *, t: float | None = None, **fields: Any) -> None:
        fields.update(ev=ev, t=time.time() if t is None else t)
        self._sup.write(encode_event(fields).decode())
        self._sup.flush()

    def _refused(self, e: OSError) -> HarnessError | None:
        """The harness error of a write the run folder's file system refused, else None."""
        return HarnessError.refused(self.run_dir, e.errno, "the supervisor") \
            if e.errno in REFUSED_WRITE else None

    # -- the run ---------------------------------------------------------------------------
    def run(self, replay: str = "") -> None:
        """Run the scenario; ``HarnessError`` when the run folder refused a write, with every
        process gone and nothing to judge."""
        try:
            self._run(replay)
        except OSError as e:
            refused = self._refused(e)
            if refused is None:
                raise
            raise refused from e
        fs = os.statvfs(self.run_dir)   # full or read-only now: a rank's last write may be lost
        if fs.f_flag & os.ST_RDONLY or (fs.f_blocks and not fs.f_bfree):   # f_bfree: root's too
            raise HarnessError.refused(self.run_dir, errno.EROFS if fs.f_flag & os.ST_RDONLY
                                       else errno.ENOSPC, "a rank or the supervisor")

    def _run(self, replay: str) -> None:
        sc = self.scenario
        deadline = time.monotonic() + sc.timeout_s
        self.record(Ev.SCENARIO, workload=sc.workload, steps=sc.steps, world_size=sc.world_size,
                    seed=sc.schedule.seed, schedule=sc.schedule.to_dict(),
                    schedule_hash=sc.schedule.hash, launcher=sc.launcher, backend=sc.backend,
                    memory_budget_bytes=sc.memory_budget_bytes, replay=replay)
        self.dir.scenario.write_text(json.dumps(sc.to_dict(), indent=2))
        world_size: int | None = sc.world_size
        roles = sc.initial_roles()
        gen = 0
        try:
            while world_size is not None:
                if gen >= sc.max_generations:
                    self.record(Ev.ABORT, detail=f"gave up after {sc.max_generations} generations")
                    self._progress(f"gave up after {sc.max_generations} generations")
                    break
                outcome = self._generation(gen, roles, deadline)
                if outcome.next_world_size is not None:
                    roles = next_roles(roles, outcome.next_world_size, lost=outcome.lost_rank,
                                       wanted=outcome.next_roles)
                    if outcome.next_devices:
                        self.devices = list(outcome.next_devices)
                    elif self.devices:
                        self.devices = devices.next_devices(self.devices, len(roles),
                                                            lost=outcome.lost_rank)
                self.device_map = outcome.device_map
                self.record(Ev.GEN_END, gen=gen, cause=outcome.cause.value, planned=outcome.planned,
                            fault_id=outcome.fault_id, detail=outcome.detail, t=outcome.at,
                            **({"live": True} if outcome.live else {}))
                self._progress(f"generation {gen} (world size {world_size}): {outcome.cause.value}"
                               + (f" - {outcome.detail}" if outcome.detail else ""))
                if self._unformed is not None:  # recorded after the generation it came from
                    started, self._unformed = self._unformed, None
                    detail = started.pop("detail")
                    self.record(Ev.GEN_START, **started)
                    self.record(Ev.GEN_END, gen=started["gen"], cause=Cause.FAILURE.value,
                                planned=False, fault_id=None, detail=detail)
                world_size = outcome.next_world_size
                gen += 1
            for i, fault in enumerate(sc.schedule.faults):
                if i not in self.fired:
                    self.record(Ev.UNFIRED, fault_id=i, detail=fault.describe())
        finally:
            self.close()

    def close(self) -> None:
        try:
            if self._next is not None:
                self._next[0].kill()
                self._next = None
            if self._live is not None:
                self._live.kill()
                self._live = None
            if self._own_launcher:
                self.launcher.close()
        finally:
            if self.throttle is not None:
                self.throttle.close()
            if self.members is not None:
                self.members.close()  # its Lighthouse, whatever failed before
            if not self._sup.closed:
                self._sup.close()

    def _note(self, what: str, fields: dict[str, Any]) -> None:
        """A launcher's note for the record (the elastic launcher's network, for one)."""
        self.record(what, **fields)
        if fields.get("note"):
            self._progress(f"{what}: {fields['note']}")

    def _plan(self, gen: int, world_size: int, roles: list[str]) -> None:
        sc = self.scenario
        faults = []
        for i, fault in enumerate(sc.schedule.faults):
            if i in self.fired:
                continue
            ranks = resolve_target(fault.target, world_size, roles, sc.schedule.seed, i)
            faults.append({"id": i, "kind": fault.kind, "ranks": ranks, "step": fault.step,
                           "phase": fault.phase, "params": dict(fault.params),
                           **kinds.executor_of(kinds.get(fault.kind))})
        plan: dict[str, Any] = {
            "seed": sc.schedule.seed, "world_size": world_size, "roles": roles,
            "device_map": self.device_map, "faults": faults, "files": sc.files,
            "keep_replaced": any(kinds.get(f.kind).loses_unsynced for i, f in
                                 enumerate(sc.schedule.faults) if i not in self.fired)}
        if self.throttle is not None and self.devices:
            entry = plan["devices"] = self.throttle.plan(gen, self.devices)
            self.record(Ev.DEVICES, gen=gen, **{k: v for k, v in entry.items() if k != "cgroups"})
        write_json(self.dir.plan(gen), plan, indent=1)

    def _specs(self, gen: int, world_size: int, roles: list[str], port: int,
               agent_store: bool) -> list[RankSpec]:
        base = {k: v for k, v in os.environ.items() if not k.startswith((Env.PREFIX, "PYTEST_"))}
        if agent_store:
            base["TORCHELASTIC_USE_AGENT_STORE"] = "True"
        base.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world_size),
            LOCAL_WORLD_SIZE=str(world_size), GROUP_RANK="0", OMP_NUM_THREADS="1",
            TORCHELASTIC_RUN_ID=f"reshard-{self.scenario.schedule.hash}", PYTHONUNBUFFERED="1",
        )
        base.update({Env.DIR: str(self.run_dir), Env.GENERATION: str(gen),
                     Env.SUPERVISOR_PID: str(os.getpid()), Env.BACKEND: self.scenario.backend,
                     Env.STEPS: str(self.scenario.steps)})
        return [RankSpec(rank=r, argv=self.argv, cwd=os.getcwd(),
                         env={**base, "RANK": str(r), "ROLE_RANK": str(r), Env.ROLE: roles[r],
                              "LOCAL_RANK": str(self.device_map[r] if self.device_map else r)},
                         log=self.dir.log(gen, r))
                for r in range(world_size)]

    def _generation(self, gen: int, roles: list[str], deadline: float) -> Outcome:
        sc = self.scenario
        world_size = len(roles)
        launched = time.monotonic()
        store: Any = None
        if self._next is not None:  # re-formed in place: planned, started and hosted already
            self._live, store, started = self._next
            self._next = None
            self.record(Ev.GEN_START, **started)
        else:
            self._plan(gen, world_size, roles)
            # Like torchrun's agent, we host the rendezvous store: ranks then connect to a store
            # that is already listening instead of racing rank 0 for it (a 2 s retry back-off).
            store = None if self.launcher.own_rendezvous else _store(world_size)
            port = store.port if store is not None else free_port()
            restart = self._live is not None  # elastic agents restart the ranks: watch them
            by: dict[str, Any] = {"by": "elastic agents"} if restart else {}
            self.record(Ev.GEN_START, gen=gen, world_size=world_size, roles=roles,
                        launcher=sc.launcher, port=port, **by)
            if self._live is not None:  # restart
                self._live = self._live.advance(gen, world_size)
            else:
                specs = self._specs(gen, world_size, roles, port, store is not None)
                self._live = self.launcher.launch(specs) if self.members is None else \
                    self.members.launch(gen, specs)
        ctx = WatchContext(sc, self.tail, self.dir, self.record, self.fired, deadline,
                           self.on_status)
        policy = InPlace(self.members if self.members is not None else Relaunch(),
                         answer=lambda *answer: self._go_live(gen, roles, *answer))
        watch = Watch(ctx, gen, self._live, world_size=world_size, launched=launched,
                      policy=policy)
        outcome = None
        try:
            outcome = watch.run()
            room = self._live.capacity()  # a killed node is lost to the next generation
            if outcome.next_world_size is not None and room is not None and \
                    outcome.next_world_size > room:
                outcome.detail += (f"; {room} ranks fit on the nodes left" if room else
                                   "; no node is left to run on")
                outcome.next_world_size = room or None
            if outcome.next_world_size is not None and self._live.restarting():
                # The surviving agents re-form the world: its size is theirs, not the fault's.
                outcome.next_world_size = self._live.next_world_size()
            if self._next is not None and not outcome.live and outcome.cause is Cause.COMPLETE:
                # The old world ran its last step before it handed over (a migration still
                # copying): the handover was never tested.
                outcome.detail = (f"the run's last step ran before the handover answered after "
                                  f"step {self._next[2]['after_step']} took place, so it was never "
                                  "tested: give the run more steps or schedule the change earlier")
                outcome.next_world_size = None
            elif self._next is not None and not outcome.live:
                outcome.detail += ("; during a live reshard, which is not retried: the run ends "
                                   "here")
                outcome.next_world_size = None
            return outcome
        finally:
            if outcome is not None and outcome.live and self._next is not None:
                self._live = None  # its survivors and leavers are the next generation's now
            elif outcome is None or outcome.next_world_size is None or \
                    not self._live.restarting():
                if self._next is not None:  # a live reshard failed: its next world never formed
                    live, _, started = self._next
                    self._next = None
                    live.kill()
                    self._unformed = {**started, "t": None, "detail": "never formed: the live "
                                      f"reshard from generation {gen} failed "
                                      f"({outcome.detail if outcome else 'an error'})"}
                self._live.kill()
                self._live = None
                self._power_loss(gen, len(roles))
                if sc.files:  # what the next generation will find: every rank is gone now
                    self.dir.disk(gen).write_text(json.dumps(filewatch.snapshot(self.dir.work)))
            del store
            self.tail.poll(gen)
            peaks = watch.ranks.peaks
            for rank in range(len(roles)):  # a rank's own last word on its peak, if it had one
                exits = [e for e in self.tail.events(gen, rank)
                         if name_of(e) == Ev.EXIT and e.get("peak_rss")]
                if exits:
                    peaks[rank] = max(peaks.get(rank, 0), int(exits[-1]["peak_rss"]))
            for rank, peak in sorted(peaks.items()):
                self.record(Ev.RSS, gen=gen, rank=rank, peak_bytes=peak,
                            budget_bytes=sc.memory_budget_bytes)

    def _power_loss(self, gen: int, world_size: int) -> None:
        """Where the power went in ``gen`` (``power_loss``): undo what was not durable, now
        that every rank is dead, before the snapshot and the next generation see the folder."""
        replaced = self.dir.replaced(gen)
        if not replaced.exists():
            return
        self.tail.poll(gen)
        events = [e for rank in range(world_size) for e in self.tail.events(gen, rank)]
        if any(name_of(e) == Ev.FILE and e.get("killed") == FileKill.POWER for e in events):
            undo = power.undo_of(events)
            problems = power.apply(undo, self.dir.work, replaced)
            self.record(Ev.POWER_LOSS, gen=gen, **undo.record(), problems=problems)
        shutil.rmtree(replaced, ignore_errors=True)

    def _go_live(self, gen: int, roles: list[str], outcome: Outcome | None, step: int,
                 problem: str | None) -> Outcome:
        """Every rank of ``gen`` asked to do its planned reshard in place after ``step``: plan
        the next generation, host its fresh rendezvous store, answer the ranks (``RunDir.live``)
        and start the ones that join. The survivors are the lowest ranks, as when relaunching.
        Returns the outcome to end ``gen`` with once all handed over, or the refusal (the ranks
        then raise its reason)."""
        if problem is None and not getattr(self.launcher, "keeps_processes", False):
            problem = (f"launcher {self.scenario.launcher!r} does not keep ranks across "
                       "generations; use launcher fork or local")
        if problem is None and self.members is not None:
            problem = "a live reshard in membership mode (replica_groups) is not supported"
        if problem is None and outcome is not None and outcome.replaced is not None \
                and outcome.replaced >= len(roles):
            problem = f"rank {outcome.replaced} is not a rank of this world of {len(roles)}"
        if problem is None and self.scenario.files:
            problem = ("file events are recorded per generation and process (files=True): a "
                       "process going on into the next generation cannot be judged file by file")
        if outcome is None or problem is not None:
            write_json(self.dir.live(gen), {"error": problem})
            return Outcome(Cause.FAILURE, fault_id=outcome.fault_id if outcome else None,
                           detail=f"the ranks asked to reshard in place after step {step}, "
                                  f"which the harness refused: {problem}")
        assert outcome.next_world_size is not None  # a planned reshard's outcome names the size
        new_roles = next_roles(roles, outcome.next_world_size, lost=None, wanted=outcome.next_roles)
        world = len(new_roles)
        survivors: list[int | None] = list(range(min(len(roles), world)))
        if outcome.replaced is not None:  # a migration: a joiner takes the moved rank's place
            survivors[outcome.replaced] = None
        self.device_map = outcome.device_map
        self._plan(gen + 1, world, new_roles)
        store = _store(world)
        write_json(self.dir.live(gen), {
            "gen": gen + 1, "world_size": world, "old_world_size": len(roles),
            "survivors": survivors, "master_addr": "127.0.0.1", "master_port": store.port,
            "step": step})
        # A reshard hands over now; a migration's old world trains on until its swap, when the
        # generation ends (the handover) and the next one starts.
        outcome.at = time.time() if outcome.replaced is None else None
        started = dict(gen=gen + 1, world_size=world, roles=new_roles, port=store.port,
                       launcher=self.scenario.launcher,
                       by="live reshard" if outcome.replaced is None else "migration",
                       survivors=survivors, after_step=step,
                       t=outcome.at + 1e-6 if outcome.at else None)
        joiners = [spec for rank, spec in enumerate(self._specs(gen + 1, world, new_roles,
                                                                 store.port, True))
                   if rank >= len(survivors) or survivors[rank] is None]
        for spec in joiners:
            spec.env[Env.JOIN] = str(gen)
        joined = self.launcher.launch(joiners) if joiners else None
        assert self._live is not None
        self._next = (Regrouped(self._live, survivors, joined), store, started)
        outcome.live = True
        if outcome.replaced is not None:
            outcome.detail += f"; in place: a new process took rank {outcome.replaced}'s shard"
        else:
            outcome.detail += (f"; in place: ranks {survivors} go on"
                               + (f", {len(joiners)} joined" if joiners else "")
                               + (f", ranks {list(range(world, len(roles)))} left"
                                  if world < len(roles) else ""))
        return outcome


def _store(world_size: int) -> Any:
    return launch.host_store("127.0.0.1", world_size)
