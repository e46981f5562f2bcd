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

It records what it saw to ``events/supervisor.jsonl`` (the harness's half of the history), and
every process it started is gone when ``run`` returns, whether it succeeds, fails, times out or
is interrupted.
"""
from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from pytest_reshard.supervisor.launch import ForkLauncher, Generation, LocalLauncher, RankSpec, TorchrunLauncher, free_port
from pytest_reshard.supervisor import procfs as processes
from pytest_reshard.schedule import Schedule, resolve_target

POLL_S = 0.02
PLANNED = {"shift_shards": "reshard", "rebalance": "rebalance", "preempt": "preempt",
           "drain": "drain"}
DEATHS = ("kill", "kill_node", "crash_silently", "ecc_error")  # faults whose victim may die unplanned


@dataclass
class Scenario:
    """Everything that defines a run; JSON-serialisable so it can be saved and replayed."""

    workload: str                  # a bundled workload name ("lm") or a path to a script
    world_size: int
    steps: int
    schedule: Schedule = field(default_factory=Schedule)
    args: list[str] = field(default_factory=list)
    timeout_s: float = 120.0
    backend: str = "gloo"
    launcher: str = "fork"         # fork | local | torchrun | elastic
    roles: list[str] | None = None  # role of each rank; default: default_roles(workload, ...)
    hang_s: float = 1.0            # heartbeat silence of a stopped rank (10x if the kernel disagrees)
    stall_s: float = 10.0          # no progress from any rank this long means a stall
    startup_s: float = 60.0        # first event of a generation must come within this
    failure_grace_s: float = 5.0   # after an unplanned death, survivors get this long to exit
    memory_budget_bytes: int | None = None  # per-rank peak RSS budget (CPU); None: unlimited
    min_throughput: float | None = None  # fail a generation below this share of a clean run's tokens/s
    phases: list[str] | None = None  # fault points the workload marks beyond STANDARD_PHASES
    max_generations: int = 12
    nodes: int = 1                 # elastic: torchrun agents, one per node (world_size / nodes ranks each)
    min_nodes: int = 1             # elastic: the rendezvous goes on down to this many nodes
    network: str = "auto"          # elastic: netns (a namespace and address per node), loopback, auto

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["schedule"] = self.schedule.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Scenario":
        d = dict(d)
        d["schedule"] = Schedule.from_dict(d.get("schedule", {}))
        return cls(**d)


BUNDLED = {"lm": "pytest_reshard.fixtures.lm", "dflash": "pytest_reshard.fixtures.dflash"}
#: Fault points a bundled workload marks beyond STANDARD_PHASES.
BUNDLED_PHASES = {"dflash": ("recv", "send")}


def default_roles(workload: str, world_size: int) -> list[str]:
    """Each rank's role when the scenario names none: the target + drafter pipeline splits the
    world in half (targets first), everything else is one role."""
    if workload == "dflash":
        targets = max(1, world_size // 2)
        return ["target"] * targets + ["drafter"] * (world_size - targets)
    return ["trainer"] * world_size


def expand_roles(spec: Sequence[str] | Mapping[str, int], world_size: int | None = None) -> list[str]:
    """``{"target": 3, "drafter": 1}`` (counts, in order) or an explicit list -> one role per rank."""
    if isinstance(spec, Mapping):
        roles = [role for role, n in spec.items() for _ in range(int(n))]
    else:
        roles = [str(r) for r in spec]
    if not roles or any(not r for r in roles):
        raise ValueError(f"roles {spec!r}: name at least one rank's role, none empty")
    if world_size is not None and len(roles) != world_size:
        raise ValueError(f"roles {spec!r} name {len(roles)} ranks but the world size is "
                         f"{world_size}; make the counts add up")
    return roles


def next_roles(roles: Sequence[str], size: int, *, lost: int | None = None,
               wanted: Sequence[str] | Mapping[str, int] | None = None) -> list[str]:
    """The roles of the next generation: as a planned change says (``wanted``), else the same
    ranks less the one that was lost, else trimmed (or extended) at the end."""
    if wanted:
        return expand_roles(wanted, size)
    out = list(roles)
    if lost is not None and size < len(out) and lost < len(out):
        del out[lost]
    while len(out) > size:  # trim from the end, but never a role's last rank
        spare = [i for i, r in enumerate(out) if out.count(r) > 1]
        del out[spare[-1] if spare else -1]
    out.extend(out[-1:] * (size - len(out)) if out else ["trainer"] * size)
    return out


def workload_argv(scenario: Scenario) -> tuple[list[str], list[str]]:
    """(argv after the interpreter, modules worth preloading in the fork server)."""
    module = BUNDLED.get(scenario.workload)
    if module:
        return ["-m", module, "--steps", str(scenario.steps), *scenario.args], ["pytest_reshard.supervisor.launch.warmup", module]
    path = Path(scenario.workload)
    if not path.is_file():
        raise FileNotFoundError(
            f"workload {scenario.workload!r} is neither a bundled workload "
            f"({', '.join(sorted(BUNDLED))}) nor an existing script path")
    return [str(path.resolve()), *scenario.args], ["pytest_reshard.supervisor.launch.warmup"]


class EventTail:
    """Incrementally reads the JSONL files of the run, keeping the parsed events by file."""

    def __init__(self, events_dir: Path) -> None:
        self.dir = events_dir
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}
        self.by_rank: dict[tuple[int, int], list[dict]] = {}
        self._unseen: list[dict] = []

    def take(self) -> list[dict]:
        """Events read since the last ``take`` (whoever triggered the read)."""
        new, self._unseen = self._unseen, []
        return new

    def poll(self, gen: int) -> None:
        """Read what the ranks of ``gen`` appended since the last poll."""
        for path in sorted(self.dir.glob(f"g{gen}-r*.jsonl")):
            with open(path, "rb") as f:
                f.seek(self._offsets.get(path, 0))
                chunk = f.read()
            if not chunk:
                continue
            self._offsets[path] = self._offsets.get(path, 0) + len(chunk)
            data = self._partial.pop(path, b"") + chunk
            *lines, rest = data.split(b"\n")
            if rest:
                self._partial[path] = rest
            for line in lines:
                ev = json.loads(line)
                self.by_rank.setdefault((ev["gen"], ev["rank"]), []).append(ev)
                self._unseen.append(ev)

    def events(self, gen: int, rank: int) -> list[dict]:
        return self.by_rank.get((gen, rank), [])

    def pids(self, gen: int) -> dict[int, int]:
        self.poll(gen)
        return {r: evs[0]["pid"] for (g, r), evs in self.by_rank.items()
                if g == gen and evs and evs[0]["ev"] == "start"}

    def clean_exit(self, gen: int, rank: int) -> bool:
        self.poll(gen)
        evs = self.events(gen, rank)
        return bool(evs) and evs[-1]["ev"] == "exit"

    def last_position(self, gen: int, rank: int) -> tuple[int | None, str | None]:
        """(step, phase) where the rank was last seen."""
        for ev in reversed(self.events(gen, rank)):
            if ev["ev"] == "point":
                return ev["step"], ev["phase"]
            if ev["ev"] in ("begin", "end", "error", "fault"):
                phase = {"begin": "begin", "end": "end"}.get(ev["ev"], ev.get("phase"))
                return ev["step"], phase
        return None, "startup"


@dataclass
class Outcome:
    """How a generation ended and what comes next."""

    cause: str                      # complete | reshard | preempt | failure | hang | timeout | error
    planned: bool = False
    fault_id: int | None = None
    detail: str = ""
    next_world_size: int | None = None  # None: the run is over
    lost_rank: int | None = None    # the rank whose unplanned loss ended the generation
    next_roles: Any = None          # roles a planned change asks for (counts or a list)
    device_map: list[int] | None = None  # the next generation's rank -> device map (rebalance)


class Supervisor:
    #: Called with a ``progress.Status`` after each batch of events (the live progress line).
    on_status: Callable[[Any], None] | None = None

    def __init__(self, scenario: Scenario, run_dir: Path, *,
                 progress: Callable[[str], None] | None = None,
                 launcher: Any | None = None) -> None:
        self.scenario = scenario
        self.run_dir = Path(run_dir)
        self.events_dir = self.run_dir / "events"
        self.logs_dir = self.run_dir / "logs"
        for d in (self.events_dir, self.logs_dir, self.run_dir / "work"):
            d.mkdir(parents=True, exist_ok=True)
        self.tail = EventTail(self.events_dir)
        self._progress = progress or (lambda msg: None)
        self._sup = open(self.events_dir / "supervisor.jsonl", "a")
        self.argv, preload = workload_argv(scenario)
        self._own_launcher = launcher is None
        self.launcher = launcher or make_launcher(scenario.launcher, preload, self.tail,
                                                  scenario=scenario, note=self._note)
        self.fired: dict[int, dict] = {}  # fault id -> the fault event that fired it
        self.device_map: list[int] | None = None  # rank -> device, set by a rebalance
        self._live: Generation | None = None

    # -- recording -------------------------------------------------------------------------
    def record(self, ev: str, **fields: Any) -> None:
        fields.update(ev=ev, t=time.time())
        self._sup.write(json.dumps(fields) + "\n")
        self._sup.flush()

    # -- the run ---------------------------------------------------------------------------
    def run(self, replay: str = "") -> None:
        sc = self.scenario
        deadline = time.monotonic() + sc.timeout_s
        self.record("scenario", workload=sc.workload, steps=sc.steps, world_size=sc.world_size,
                    seed=sc.schedule.seed, schedule=sc.schedule.to_dict(),
                    schedule_hash=sc.schedule.hash, launcher=sc.launcher, backend=sc.backend,
                    memory_budget_bytes=sc.memory_budget_bytes, replay=replay)
        (self.run_dir / "scenario.json").write_text(json.dumps(sc.to_dict(), indent=2))
        world_size: int | None = sc.world_size
        roles = expand_roles(sc.roles, sc.world_size) if sc.roles else \
            default_roles(sc.workload, sc.world_size)
        gen = 0
        try:
            while world_size is not None:
                if gen >= sc.max_generations:
                    self.record("abort", detail=f"gave up after {sc.max_generations} generations")
                    self._progress(f"gave up after {sc.max_generations} generations")
                    break
                outcome = self._generation(gen, roles, deadline)
                if outcome.next_world_size is not None:
                    roles = next_roles(roles, outcome.next_world_size, lost=outcome.lost_rank,
                                       wanted=outcome.next_roles)
                self.device_map = outcome.device_map
                self.record("gen_end", gen=gen, cause=outcome.cause, planned=outcome.planned,
                            fault_id=outcome.fault_id, detail=outcome.detail)
                self._progress(f"generation {gen} (world size {world_size}): {outcome.cause}"
                               + (f" - {outcome.detail}" if outcome.detail else ""))
                world_size = outcome.next_world_size
                gen += 1
            for i, fault in enumerate(sc.schedule.faults):
                if i not in self.fired:
                    self.record("unfired", fault_id=i, detail=fault.describe())
        finally:
            self.close()

    def close(self) -> None:
        if self._live is not None:
            self._live.kill()
            self._live = None
        if self._own_launcher:
            self.launcher.close()
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
                           "phase": fault.phase, "params": dict(fault.params)})
        plan = {"seed": sc.schedule.seed, "world_size": world_size, "roles": roles,
                "device_map": self.device_map, "faults": faults}
        (self.run_dir / f"plan-g{gen}.json").write_text(json.dumps(plan, indent=1))

    def _specs(self, gen: int, world_size: int, roles: list[str], port: int,
               agent_store: bool) -> list[RankSpec]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("RESHARD_", "PYTEST_"))}
        if agent_store:
            base["TORCHELASTIC_USE_AGENT_STORE"] = "True"
        base.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world_size),
            LOCAL_WORLD_SIZE=str(world_size), GROUP_RANK="0", OMP_NUM_THREADS="1",
            TORCHELASTIC_RUN_ID=f"reshard-{self.scenario.schedule.hash}",
            RESHARD_DIR=str(self.run_dir), RESHARD_GENERATION=str(gen),
            RESHARD_SUPERVISOR_PID=str(os.getpid()), RESHARD_BACKEND=self.scenario.backend,
            RESHARD_STEPS=str(self.scenario.steps), PYTHONUNBUFFERED="1",
        )
        return [RankSpec(rank=r, argv=self.argv, cwd=os.getcwd(),
                         env={**base, "RANK": str(r), "ROLE_RANK": str(r), "RESHARD_ROLE": roles[r],
                              "LOCAL_RANK": str(self.device_map[r] if self.device_map else r)},
                         log=self.logs_dir / f"g{gen}-r{r}.log")
                for r in range(world_size)]

    def _generation(self, gen: int, roles: list[str], deadline: float) -> Outcome:
        sc = self.scenario
        world_size = len(roles)
        self._plan(gen, world_size, roles)
        launched = time.monotonic()
        # Like torchrun's agent, we host the rendezvous store: ranks then connect to a store
        # that is already listening instead of racing rank 0 for it (a 2 s retry back-off).
        store = None if sc.launcher in ("torchrun", "elastic") else _store(world_size)
        port = store.port if store is not None else free_port()
        restart = self._live is not None  # elastic agents restart the ranks: watch, don't launch
        self.record("gen_start", gen=gen, world_size=world_size, roles=roles,
                    launcher=sc.launcher, port=port, **({"by": "elastic agents"} if restart else {}))
        if restart:
            self._live = self._live.advance(gen, world_size)
        else:
            self._live = self.launcher.launch(self._specs(gen, world_size, roles, port,
                                                          store is not None))
        watch = _Watch(self, gen, world_size, launched, deadline)
        outcome = None
        try:
            outcome = watch.run()
            if outcome.next_world_size is not None and getattr(self._live, "restarting", bool)():
                # The surviving agents re-form the world: its size is theirs, not the fault's.
                outcome.next_world_size = self._live.next_world_size()
            return outcome
        finally:
            if outcome is None or outcome.next_world_size is None or \
                    not getattr(self._live, "restarting", bool)():
                self._live.kill()
                self._live = None
            del store
            self.tail.poll(gen)
            for rank in range(len(roles)):  # a rank's own last word on its peak, if it had one
                exits = [e for e in self.tail.events(gen, rank) if e["ev"] == "exit" and e.get("peak_rss")]
                if exits:
                    watch.peaks[rank] = max(watch.peaks.get(rank, 0), int(exits[-1]["peak_rss"]))
            for rank, peak in sorted(watch.peaks.items()):
                self.record("rss", gen=gen, rank=rank, peak_bytes=peak,
                            budget_bytes=sc.memory_budget_bytes)


def _is_fault(ev: dict, kinds: Sequence[str]) -> bool:
    """A fault event of one of ``kinds``; an ECC error kills its rank only at the compute layer
    (a raised CUDA error), never through telemetry (a counter the workload reads)."""
    return ev["ev"] == "fault" and ev["kind"] in kinds and (
        ev["kind"] != "ecc_error" or ev["params"].get("layer") == "compute")


def _store(world_size: int) -> Any:
    from datetime import timedelta

    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False,
                    timeout=timedelta(seconds=60))


def rebalanced(world_size: int, fraction: float, seed: str) -> list[int]:
    """A rank -> device map that moves ``fraction`` of the ranks (at least two) to other devices:
    the chosen ones rotate one place among themselves, drawn from ``seed`` for replays."""
    import random

    moved = sorted(random.Random(seed).sample(range(world_size),
                                               min(world_size, max(2, round(fraction * world_size)))))
    device_map = list(range(world_size))
    for i, shard in enumerate(moved):
        device_map[shard] = moved[(i + 1) % len(moved)]
    return device_map


def make_launcher(name: str, preload: Sequence[str], tail: EventTail, *,
                  scenario: Scenario | None = None,
                  note: Callable[[str, dict[str, Any]], None] | None = None) -> Any:
    if name == "elastic":
        from pytest_reshard.supervisor.launch.elastic import ElasticLauncher

        sc = scenario or Scenario(workload="", world_size=1, steps=1)
        return ElasticLauncher(sc.nodes, tail.pids, tail.clean_exit, min_nodes=sc.min_nodes,
                               network=sc.network, note=note)
    if name == "fork":
        return ForkLauncher(preload)
    if name == "local":
        return LocalLauncher()
    if name == "torchrun":
        return TorchrunLauncher(tail.pids, tail.clean_exit)
    raise ValueError(f"unknown launcher {name!r}: use 'fork', 'local', 'torchrun' or 'elastic'")


class _Watch:
    """The poll loop of one generation; returns its Outcome."""

    def __init__(self, sup: Supervisor, gen: int, world_size: int, launched: float,
                 deadline: float) -> None:
        self.sup, self.gen, self.world_size = sup, gen, world_size
        self.sc = sup.scenario
        self.deadline = deadline
        self.last_progress = launched
        self.started_training = False
        self.planned: dict | None = None       # the planned-event fault that fired here
        self.plan_deadline: float | None = None
        self.failure: tuple[int, int, float, str] | None = None  # rank, code, when, detail
        self.reported: set[int] = set()
        self.peaks: dict[int, int] = {}  # rank -> peak RSS bytes seen
        self.hung: Outcome | None = None  # how the generation ends, once a hung rank is killed
        self.step: int | None = None     # the highest step begun in this generation

    def _detect(self, kind: str, rank: int, *, expected: bool, code: int | None = None,
                since: float | None = None) -> str:
        step, phase = self.sup.tail.last_position(self.gen, rank)
        latency = None if since is None else round(time.time() - since, 4)
        self.sup.record("detect", gen=self.gen, kind=kind, rank=rank, step=step, phase=phase,
                        exit_code=code, latency_s=latency, expected=expected)
        where = f"at step {step}, phase {phase}" if step is not None else "before its first step"
        return {"died": f"rank {rank} died (exit code {code}) {where}",
                "stopped": f"rank {rank} stopped responding {where}",
                "stalled": f"no rank made progress for {self.sc.stall_s:.0f} s; rank {rank} "
                           f"was last seen {where}",
                "exited_early": f"rank {rank} exited with code 0 {where} without a planned event",
                }[kind] + f" (generation {self.gen})"

    def _on_events(self, events: list[dict]) -> None:
        now = time.monotonic()
        for ev in events:
            if ev["gen"] != self.gen:
                continue  # read late, after its generation ended
            self.last_progress = now
            kind = ev["ev"]
            if kind == "begin":
                self.started_training = True
            elif kind == "fault" and ev["id"] not in self.sup.fired:
                self.sup.fired[ev["id"]] = ev
                if ev["kind"] in PLANNED and self.planned is None:
                    self.planned = ev
                    grace = ev["params"].get("notice_s", ev["params"].get("grace_s", 30.0))
                    self.plan_deadline = now + float(grace)
            elif kind == "request" and self.planned is None:
                # The workload drains itself (e.g. its health monitor saw an ECC error): planned,
                # attributed to the last fault that fired in this generation, if any.
                fired = [f for f in self.sup.fired.values() if f["gen"] == self.gen]
                self.planned = {"kind": "drain", "id": fired[-1]["id"] if fired else None,
                                "step": ev["step"] if "step" in ev else None, "phase": "request",
                                "params": {"to_world_size": ev["to_world_size"]},
                                "reason": ev.get("reason", "")}
                self.plan_deadline = now + float(ev.get("grace_s", 30.0))
        if events and self.sup.on_status is not None:
            self._status(events)

    def _status(self, events: list[dict]) -> None:
        from pytest_reshard.reports.progress import Status

        begun = [ev["step"] for ev in events if ev["gen"] == self.gen and ev["ev"] == "begin"]
        if begun:
            self.step = max([*begun, *([] if self.step is None else [self.step])])
        self.sup.on_status(Status(self.gen, self.world_size, self.step, self.sc.steps,
                                  len(self.sup.fired), len(self.sc.schedule.faults)))

    def _on_exit(self, rank: int, code: int, codes: dict[int, int | None], now: float) -> None:
        """Judge one rank's exit: normal, or the generation's first failure."""
        normal = code == 0 or self.sup.tail.clean_exit(self.gen, rank)  # SIGABRT after close
        if normal and (self.planned is not None or (self._last_end(rank) or -1) >= self.sc.steps - 1):
            self.reported.add(rank)
            return
        # Peers of a killed rank die too ("Connection closed by peer"), sometimes before its
        # own exit is reaped: blame the rank an unplanned-death fault fired on.
        culprit = self._faulted_rank(DEATHS)
        if culprit is not None:
            if codes.get(culprit) is None:
                return  # judge again once the culprit's exit is reported
            rank, code = culprit, codes[culprit]
            normal = code == 0 or self.sup.tail.clean_exit(self.gen, rank)
        self.reported.add(rank)
        fault = self._fault_for(rank, DEATHS)
        # exit 0 mid-run without a planned event: a silent death, the drafter story of seed 001
        kind = "exited_early" if normal else "died"
        detail = self._detect(kind, rank, expected=fault is not None, code=code,
                              since=fault["t"] if fault else None)
        self.failure = (rank, code, now, detail)

    def _watch_memory(self, live: Generation, codes: dict[int, int | None]) -> None:
        """Track each rank's peak RSS; past the budget, end the rank as the OOM killer would."""
        budget = self.sc.memory_budget_bytes
        for rank, pid in live.pids().items():
            if codes.get(rank) is not None:
                continue
            peak = processes.peak_rss(pid)
            if peak is None:
                continue
            self.peaks[rank] = max(peak, self.peaks.get(rank, 0))
            if budget and peak > budget and self.failure is None:
                live.signal(rank, signal.SIGKILL)
                step, phase = self.sup.tail.last_position(self.gen, rank)
                where = f"at step {step}, phase {phase}" if step is not None else "before its first step"
                detail = (f"rank {rank} exceeded its memory budget {where}: peak RSS "
                          f"{peak / 2**20:.0f} MiB > budget {budget / 2**20:.0f} MiB; "
                          f"killed it as the OOM killer would")
                self.sup.record("detect", gen=self.gen, kind="oom", rank=rank, step=step,
                                phase=phase, exit_code=-signal.SIGKILL, latency_s=None,
                                expected=False, detail=detail)
                self.reported.add(rank)
                self.failure = (rank, -signal.SIGKILL, time.monotonic(), detail)

    def _faulted_rank(self, kinds: Sequence[str]) -> int | None:
        for (gen, rank), evs in self.sup.tail.by_rank.items():
            if gen == self.gen and any(_is_fault(e, kinds) for e in evs):
                return rank
        return None

    def _fault_for(self, rank: int, kinds: Sequence[str]) -> dict | None:
        return next((e for e in self.sup.tail.events(self.gen, rank) if _is_fault(e, kinds)), None)

    def run(self) -> Outcome:
        sup, sc, gen = self.sup, self.sc, self.gen
        live = sup._live
        assert live is not None
        while True:
            codes = live.exit_codes()  # first: a rank writes all its events before it exits
            sup.tail.poll(gen)
            self._on_events(sup.tail.take())
            now = time.monotonic()
            # Judge exits in the order the ranks went quiet: in a cascade the root cause (a
            # silent exit, an exception of its own) stops writing events before its peers fail.
            exited = [r for r, c in codes.items() if c is not None and r not in self.reported]
            for rank in sorted(exited, key=self._last_event_t):
                if self.failure is None:
                    self._on_exit(rank, codes[rank], codes, now)
            self._watch_memory(live, codes)
            if all(c is not None for c in codes.values()):
                return self._classify(codes)
            if self.failure and now - self.failure[2] > sc.failure_grace_s:
                return self._classify(codes)
            if self.plan_deadline is not None and now > self.plan_deadline:
                return self._missed_deadline(codes)
            hung = self._stopped_rank(codes) if self.failure is None else None
            if hung is not None:
                self._end_hung(live, hung, self._hang("stopped", hung,
                                                      since=os.path.getmtime(self._hb(hung))))
                continue
            quiet = now - self.last_progress
            limit = sc.stall_s if self.started_training else sc.startup_s
            if quiet > limit and self.failure is None and self.plan_deadline is None:
                # Everyone is alive and silent: blame the rank a hang fault fired on, if any.
                culprit = self._faulted_rank(("hang",))
                rank = culprit if culprit is not None else \
                    min((r for r, c in codes.items() if c is None), default=0)
                self._end_hung(live, rank, self._hang("stalled", rank, since=None))
                continue
            if now > self.deadline:
                return Outcome("timeout", detail=f"scenario timeout of {sc.timeout_s:.0f} s "
                               f"reached in generation {gen}")
            time.sleep(POLL_S)

    def _hang(self, kind: str, rank: int, since: float | None) -> Outcome:
        fault = self._fault_for(rank, ("hang",))
        detail = self._detect(kind, rank, expected=fault is not None,
                              since=fault["t"] if fault and since is None else since)
        if fault is None:
            return Outcome("hang", detail=detail)
        after = int(fault["params"].get("then_world_size") or self.world_size)
        return Outcome("hang", fault_id=fault["id"], detail=detail, next_world_size=after,
                       lost_rank=rank)

    def _end_hung(self, live: Generation, rank: int, outcome: Outcome) -> None:
        """Kill only the hung rank and treat it as a death: its peers then fail their next
        collective and get the failure grace to save what they hold (an emergency snapshot),
        exactly as after a kill; killing them all at once would throw that state away."""
        live.signal(rank, signal.SIGKILL)
        self.hung = outcome
        self.reported.add(rank)
        self.failure = (rank, -signal.SIGKILL, time.monotonic(), outcome.detail)

    def _hb(self, rank: int) -> Path:
        return self.sup.events_dir / f"g{self.gen}-r{rank}.hb"

    def _stopped_rank(self, codes: dict[int, int | None]) -> int | None:
        """A live rank whose heartbeat is silent: at once (``hang_s``) if the kernel says it is
        stopped, else only after ``10 * hang_s`` (at least 10 s): a busy machine or a long
        import holding the GIL can delay a heartbeat, and a false "stopped" is a false verdict.
        """
        now = time.time()
        pids = self.sup._live.pids() if self.sup._live is not None else {}
        for rank, code in codes.items():
            if code is not None:
                continue
            try:
                age = now - os.path.getmtime(self._hb(rank))
            except FileNotFoundError:
                continue  # not attached yet: covered by the startup limit
            if age > self.sc.hang_s and (processes.stopped(pids.get(rank))
                                         or age > max(10 * self.sc.hang_s, 10.0)):
                return rank
        return None

    def _missed_deadline(self, codes: dict[int, int | None]) -> Outcome:
        ev = self.planned or {}
        alive = sorted(r for r, c in codes.items() if c is None)
        return Outcome("failure", fault_id=ev.get("id"),
                       detail=f"{ev.get('kind')} at step {ev.get('step')} {ev.get('phase')}: "
                              f"ranks {alive} were still running when the "
                              f"{'notice' if ev.get('kind') == 'shift_shards' else 'grace period'}"
                              f" ran out (generation {self.gen}); killed them")

    def _classify(self, codes: dict[int, int | None]) -> Outcome:
        sc = self.sc
        if self.hung is not None:
            return self.hung
        if self.failure is not None:
            rank, code, _, detail = self.failure
            fault = self._fault_for(rank, DEATHS)
            if fault is None:
                return Outcome("failure", detail=detail)
            after = int(fault["params"].get("then_world_size") or self.world_size)
            return Outcome("failure", fault_id=fault["id"], detail=detail, next_world_size=after,
                           lost_rank=rank)
        if self.planned is not None and self._finished(codes):
            ev = self.planned  # a notice at the last step: nothing is left for a next generation
            return Outcome("complete", fault_id=ev["id"],
                           detail=f"{ev['kind']} arrived after the last step had run")
        if self.planned is not None:
            ev = self.planned
            cause = PLANNED[ev["kind"]]
            params = ev["params"]
            after = params.get("to_world_size") or params.get("then_world_size") or self.world_size
            detail = (f"the workload asked to drain to {after} ranks: {ev['reason']}"
                      if cause == "drain" else f"{ev['kind']} at step {ev['step']} {ev['phase']}")
            device_map = None
            if cause == "rebalance":
                device_map = rebalanced(self.world_size, params["fraction"],
                                       f"{sc.schedule.seed}:{ev['id']}")
                detail += f": rank r now on device {device_map}[r]"
            if params.get("roles"):
                detail += f"; roles now {dict(params['roles'])}"
            return Outcome(cause, planned=True, fault_id=ev["id"], detail=detail,
                           next_world_size=int(after), device_map=device_map,
                           next_roles=params.get("roles"))
        # Everybody exited 0 with nothing planned: finished, or a silent early exit.
        last = {r: self._last_end(r) for r in codes}
        short = sorted(r for r, s in last.items() if s is None or s < sc.steps - 1)
        if short:
            rank = short[0]
            return Outcome("failure", detail=self._detect("exited_early", rank, expected=False))
        return Outcome("complete")

    def _last_event_t(self, rank: int) -> float:
        events = self.sup.tail.events(self.gen, rank)
        return events[-1]["t"] if events else float("inf")

    def _finished(self, codes: dict[int, int | None]) -> bool:
        """Every rank ended the run's last step (so there is nothing left to resume)."""
        return all((self._last_end(r) or -1) >= self.sc.steps - 1 for r in codes)

    def _last_end(self, rank: int) -> int | None:
        """The last step whose effect the rank holds: the last it ended, or the one before where
        it resumed (a generation that resumes past the last step has nothing left to run)."""
        done = [ev["step"] if ev["ev"] == "end" else ev["step"] - 1
                for ev in self.sup.tail.events(self.gen, rank) if ev["ev"] in ("end", "resumed")]
        return max(done) if done else None
