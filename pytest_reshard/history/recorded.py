"""A production job's record-mode files as a ``History`` (``pytest-reshard judge DIR``).

Record mode (``Env.RECORD``, ``probe.attach(record=DIR)``) writes each process's events into its
own file, ``rec-r{rank}-{host}-{pid}-{ms}.jsonl`` (``contract.RECORD_FILE``), under whatever
launcher runs the job. There is no supervisor: no ``scenario.json``, no plan, no
``supervisor.jsonl``. This module derives what the checkers read from the supervisor's events,
and nothing else:

- **Generations** from the start events (``generations_of``): one per launch of the job's
  processes. Where every start of a job carries the launcher's restart count (torchrun's
  ``TORCHELASTIC_RESTART_COUNT``, SLURM's ``SLURM_RESTART_COUNT``) that count orders them; else
  the order of the incarnations does: a rank that starts again begins the next generation. Jobs
  (torchrun's run id, SLURM's job id) follow each other in the order they started, so a job
  resubmitted from its checkpoint is the next generation.
- **How each generation ended** (``gen_end``): every rank of its world closed (``run.close()``):
  a planned end (a preemption when each saw a SIGTERM land, a drain when one asked for it, else
  complete); otherwise an unplanned failure naming the ranks that never closed and their last
  step. Nothing is guessed about why a process vanished: the probe cannot see its exit code.
- **The target step** (``scenario``): the step count the job declared (``RESHARD_STEPS`` in its
  environment), else, when the last generation closed on every rank, the last step it
  committed. Otherwise there is no scenario record, and liveness says it cannot tell.

Two processes recorded as the same rank of one generation cannot both be it: the second file's
start is reported as damaged, and nothing is judged.

The history's order is by generation, then by each event's time (``load_recorded``): the clocks
of different hosts differ, so within a generation a timeline across hosts is as good as their
NTP, but no host's skew can reorder the generations.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from functools import partial
from itertools import compress
from typing import Any, Iterable, Sequence

from pytest_reshard.contract import (PREEMPT_SIGNAL, RECORD_FILE, SUPERVISOR_EVENTS, Cause,
                                     Damaged, Ev, Torn, read_jsonl)
from pytest_reshard.history.loading import HistoryError, parsing, validate, without_gc
from pytest_reshard.history.queries import History
from pytest_reshard.history.records import Event
from pytest_reshard.history.streams import BEGIN, END, POINT, RankStream, Recorded, shape_table

__all__ = ["Incarnation", "recorded_files", "incarnation_of", "generations_of", "supervisor_events",
           "load_recorded", "is_recorded"]

#: The launcher named in a generation whose processes said none.
UNKNOWN_LAUNCHER = "recorded"


@dataclass(frozen=True)
class Incarnation:
    """One process of a recorded job: its file and what its ``start`` event says."""

    path: Path
    rank: int
    t: float                  # when it attached
    host: str = ""
    pid: int | None = None
    launcher: str | None = None
    restart: int | None = None   # the launcher's restart count, None when it gave none
    launch: tuple[int, ...] | None = None   # its place in the job: requeue, srun step, restart
    job: str | None = None       # torchrun's run id or SLURM's job id
    world_size: int = 1
    role: str = "trainer"
    steps: int | None = None     # the step count the job declared (RESHARD_STEPS)
    script: str = ""             # the script's file name (sys.argv[0])

    def describe(self) -> str:
        """``rank 1 (pid 4242 on node7)``."""
        where = f"pid {self.pid}" if self.pid is not None else "pid ?"
        return f"rank {self.rank} ({where}{f' on {self.host}' if self.host else ''})"


def recorded_files(folder: Path) -> list[Path]:
    """The record-mode files under ``folder`` (its subfolders too: files gathered from each
    node's local disk into one folder per node), in name order."""
    return sorted((p for p in Path(folder).rglob("rec-r*.jsonl") if RECORD_FILE.fullmatch(p.name)),
                  key=lambda p: (p.name, str(p)))


def is_recorded(folder: Path) -> bool:
    """Whether ``folder`` holds a record-mode recording (and no harness run folder)."""
    return bool(recorded_files(folder))


def incarnation_of(path: Path, start: Event) -> Incarnation:
    """The incarnation a file's ``start`` event describes."""
    def opt_int(v: Any) -> int | None:
        return int(v) if isinstance(v, int) and not isinstance(v, bool) else None

    return Incarnation(
        path=path, rank=int(start["rank"]), t=float(start.get("t", 0.0)),
        host=str(start.get("host") or ""), pid=opt_int(start.get("pid")),
        launcher=str(start["launcher"]) if start.get("launcher") else None,
        restart=opt_int(start.get("restart")),
        launch=tuple(int(x) for x in start["launch"]) if isinstance(start.get("launch"), list)
        else None,
        job=str(start["job"]) if start.get("job") not in (None, "") else None,
        world_size=int(start.get("world_size") or 1), role=str(start.get("role") or "trainer"),
        steps=opt_int(start.get("steps")), script=str(start.get("script") or ""))


def generations_of(incarnations: Sequence[Incarnation]) -> list[int]:
    """The generation of each incarnation (same order), numbered from 0.

    Jobs in the order they started; within a job, by each launch's place in it when every
    incarnation of the job carries one (SLURM's requeue count, its ``srun`` step, torchrun's
    restart count), else by the launcher's restart count, else by order: incarnations sorted
    by start time, a rank seen again in the current generation begins the next one."""
    first_t: dict[str | None, float] = {}
    for inc in incarnations:
        first_t[inc.job] = min(first_t.get(inc.job, inc.t), inc.t)
    keys: list[tuple[int, ...]] = [(0, 0)] * len(incarnations)
    for j, job in enumerate(sorted(first_t, key=lambda k: (first_t[k], str(k)))):
        members = [i for i, inc in enumerate(incarnations) if inc.job == job]
        if all(incarnations[i].launch is not None for i in members):
            for i in members:
                keys[i] = (j, *(incarnations[i].launch or ()))
            continue
        if all(incarnations[i].restart is not None for i in members):
            for i in members:
                keys[i] = (j, int(incarnations[i].restart or 0))
            continue
        gen, ranks = 0, set[int]()
        for i in sorted(members, key=lambda i: (incarnations[i].t, incarnations[i].rank)):
            if incarnations[i].rank in ranks:
                gen, ranks = gen + 1, set()
            ranks.add(incarnations[i].rank)
            keys[i] = (j, gen)
    number = {k: n for n, k in enumerate(sorted(set(keys)))}
    return [number[k] for k in keys]


def supervisor_events(by_gen: dict[int, list[RankStream]],
                      starts: dict[int, dict[int, Incarnation]]) -> list[Event]:
    """The supervisor's events a recorded history lacks, derived from its ranks' events
    (``by_gen``: each generation's streams; ``starts``: its incarnations by rank): a
    ``gen_start`` and a ``gen_end`` per generation, and a ``scenario`` when the target step
    can be told (module docstring)."""
    out: list[Event] = []
    final = max(by_gen, default=None)
    target: int | None = None
    for gen in sorted(by_gen):
        streams, incs = by_gen[gen], starts.get(gen, {})
        world = max([inc.world_size for inc in incs.values()] + [max(incs, default=-1) + 1])
        launchers = {inc.launcher for inc in incs.values() if inc.launcher}
        launcher = launchers.pop() if len(launchers) == 1 else UNKNOWN_LAUNCHER
        roles = [incs[r].role if r in incs else "trainer" for r in range(world)]
        times = [t for st in streams for t in _span(st)]
        t0, t1 = min(times, default=0.0), max(times, default=0.0)
        # just before its first event and just after its last: the history's order is by time
        out.append({"ev": Ev.GEN_START.value, "t": t0 - 1e-6, "gen": gen, "world_size": world,
                    "roles": roles, "launcher": launcher, "recorded": True})
        cause, planned, detail = _ending(streams, incs, world)
        out.append({"ev": Ev.GEN_END.value, "t": t1 + 1e-6, "gen": gen, "cause": cause.value,
                    "planned": planned, "fault_id": None, "detail": detail, "recorded": True})
        if gen == final:
            declared = [inc.steps for inc in incs.values() if inc.steps is not None]
            if declared:
                target = max(declared)
            elif cause is Cause.COMPLETE:
                committed = _committed(streams, world)
                target = max(committed) + 1 if committed else None
            if target is not None:
                out.insert(0, {"ev": Ev.SCENARIO.value, "t": min(float(e["t"]) for e in out) - 1e-6,
                               "workload": _script(starts), "steps": target,
                               "world_size": max(i.world_size for gs in starts.values()
                                                 for i in gs.values()),
                               "seed": 0, "schedule": {"seed": 0, "faults": []},
                               "schedule_hash": None, "replay": None, "launcher": launcher,
                               "recorded": True})
    return out


def _span(s: RankStream) -> tuple[float, ...]:
    """The earliest and the latest time of a stream's events (none when it has none)."""
    times = [*compress(s.t, s.kind), *(float(e["t"]) for e in s.other.values())]
    return (min(times), max(times)) if times else ()


def _script(starts: dict[int, dict[int, Incarnation]]) -> str:
    """The job's script as its processes named it (``recorded job`` when they did not)."""
    names = sorted({i.script for gs in starts.values() for i in gs.values() if i.script})
    return ", ".join(names) or "recorded job"


def _ending(streams: Sequence[RankStream], incs: dict[int, Incarnation],
            world: int) -> tuple[Cause, bool, str]:
    """How a generation ended, from its ranks' own events: (cause, planned, detail)."""
    events = [e for st in streams for e in st.other.values()]   # exits, signals, requests
    closed = {int(e["rank"]) for e in events
              if e["ev"] == Ev.EXIT and e.get("code") == 0 and not e.get("moved_to")}
    sigterm = {int(e["rank"]) for e in events
               if e["ev"] == Ev.SIGNAL and e.get("signal") == PREEMPT_SIGNAL.name
               and not e.get("armed")}
    asked = any(e["ev"] == Ev.REQUEST for e in events)
    missing = [r for r in range(world) if r not in closed]
    if not missing:
        if sigterm >= set(range(world)):
            return Cause.PREEMPT, True, "every rank saw SIGTERM, saved and closed"
        if asked:
            return Cause.DRAIN, True, "the job asked to drain; every rank closed"
        blind = sorted(int(e["rank"]) for e in events
                       if e["ev"] == Ev.EXIT and e.get("sigterm_replaced"))
        unseen = (f"; ranks {', '.join(map(str, blind))} replaced the probe's SIGTERM handler "
                  "after their last step began, so a SIGTERM since would not be recorded"
                  if blind else "")
        return Cause.COMPLETE, True, f"every rank closed (run.close()){unseen}"
    last: dict[int, tuple[int, str, str]] = {}
    for st in streams:
        for pos in reversed(range(len(st))):   # its last step event
            e = st.event(pos) if st.kind[pos] in _LAST_KINDS or pos in st.other else None
            if e is not None and "step" in e and e["ev"] in (Ev.BEGIN, Ev.POINT, Ev.END, Ev.ERROR):
                error = f": {str(e.get('error') or '')[:160]}" if e["ev"] == Ev.ERROR else ""
                last[st.rank] = (int(e["step"]), str(e.get("phase") or e["ev"]), error)
                break
    said = []
    for r in missing:
        who = incs[r].describe() if r in incs else f"rank {r} (never attached)"
        where = ("" if r not in incs else ", before its first step" if r not in last else
                 f", {'failed' if last[r][2] else 'last seen'} at step {last[r][0]} "
                 f"({last[r][1]}){last[r][2]}")
        term = ", after a SIGTERM landed" if r in sigterm else ""
        said.append(f"{who}{where}{term}")
    return (Cause.FAILURE, False,
            f"recorded no clean exit (run.close()): {'; '.join(said)}; the probe cannot see "
            "how a process ended (see the job's own logs)")


def _committed(streams: Iterable[RankStream], world: int) -> set[int]:
    ended: dict[int, set[int]] = {}
    for st in streams:
        for step in set(st.steps_of(END)):
            ended.setdefault(step, set()).add(st.rank)
    return {s for s, ranks in ended.items() if ranks >= set(range(world))}


#: The per-step kinds a stream holds as columns that can be a rank's last step event.
_LAST_KINDS = frozenset({BEGIN, POINT, END})


def load_recorded(folder: str | Path) -> History:
    """The history of a record-mode folder (module docstring). Raises ``HistoryError`` when it
    holds no record-mode file."""
    root = Path(folder)
    if not root.is_dir():
        raise HistoryError(f"{root}: no such folder; pass the folder RESHARD_RECORD named")
    files = recorded_files(root)
    if not files:
        raise HistoryError(f"{root}: no record-mode files (rec-r*.jsonl); did the job run with "
                           "RESHARD_RECORD set to this folder, or probe.attach(record=...)?")
    with without_gc():   # as History.load: millions of objects, no cycles among them
        return _load_recorded(root, files)


def _load_recorded(root: Path, files: list[Path]) -> History:
    torn: list[Torn] = []
    damaged: list[Damaged] = []
    parsed: list[tuple[Incarnation, RankStream]] = []
    with parsing(_parse_record_file, files) as each:
        for start, stream, shapes, file_torn, file_damaged in each:
            torn += file_torn
            damaged += file_damaged
            if start is not None and stream is not None:
                stream.shape = Recorded.own_shapes(stream.shape, shapes)
                parsed.append((start, stream))
    gens = generations_of([inc for inc, _ in parsed])
    starts: dict[int, dict[int, Incarnation]] = {}
    by_gen: dict[int, list[RankStream]] = {}
    for (inc, stream), gen in zip(parsed, gens):
        other = starts.setdefault(gen, {}).get(inc.rank)
        if other is not None:
            damaged.append(Damaged(str(inc.path), 1, f"a second process recorded as rank "
                                   f"{inc.rank} of generation {gen} ({other.path.name} is the "
                                   "other): two jobs or runs recorded into one folder, or "
                                   "launches its launcher did not count apart?", written=False))
            continue
        starts[gen][inc.rank] = inc
        stream.gen = gen
        stream.other = {pos: {**kept, "gen": gen} for pos, kept in stream.other.items()}
        by_gen.setdefault(gen, []).append(stream)
    derived = supervisor_events(by_gen, starts)
    # The history's order (module docstring): by generation, then time, as one number: each
    # generation's times shifted into a band of its own, wider than the whole recording.
    # Hosts' clocks differ, so time alone would let one host's skew put a generation before the
    # one it followed. The scenario record, which has no generation, comes first.
    times = [t for streams in by_gen.values() for st in streams for t in _span(st)]
    times += [float(e["t"]) for e in derived]
    t0 = min(times, default=0.0)
    band = max(times, default=0.0) - t0 + 1.0

    def shift(gen: int) -> float:
        return (gen + 1) * band - t0

    recorded = Recorded()
    for gen in sorted(by_gen):
        for stream in by_gen[gen]:
            recorded.adopt(stream, shift=shift(gen))
    for made in derived:
        recorded.add(made, float(made["t"]) + shift(made["gen"] if "gen" in made else -1))
    recorded.order(by_key=True)   # stable: within a time, the files' order, then the derived
    return History(recorded, torn=torn, damaged=damaged, run_dir=root)


def _parse_record_file(path: Path, *, apart: bool = False) -> tuple[
        Incarnation | None, RankStream | None, list[tuple[str, ...]] | None, list[Torn],
        list[Damaged]]:
    """A record-mode file as its incarnation and its events' stream (its generation is derived
    once every file is read), the field orders its shape ids index (``apart``: parsed in a pool's
    process), its torn last line and its damaged lines (None, None when it has no start)."""
    numbered, torn, damaged = read_jsonl(path)
    check = partial(_in_record_file, rank=int(_match(path).group(1)))
    first = None
    for i, (lineno, e) in enumerate(numbered):   # what comes before its start is damaged
        try:
            check(e)
            if e["ev"] != Ev.START:
                raise HistoryError("the file's first event is not its start (probe.attach())")
        except HistoryError as err:
            damaged.append(Damaged(str(path), lineno, str(err)))
            continue
        first = i
        break
    if first is None:
        return None, None, None, torn, damaged
    start = numbered[first][1]
    stream = RankStream(start["gen"], start["rank"])
    damaged += [Damaged(str(path), n, why) for n, why in stream.take(numbered[first:], check)]
    return incarnation_of(path, start), stream, shape_table() if apart else None, torn, damaged


def _in_record_file(e: Event, rank: int) -> None:
    validate(e)
    if e["ev"] in SUPERVISOR_EVENTS:
        raise HistoryError(f"supervisor event {e['ev']!r} in a rank's file")
    if e["rank"] != rank:
        raise HistoryError(f"event of rank {e['rank']} in the file of rank {rank}")


def _match(path: Path) -> re.Match[str]:
    m = RECORD_FILE.fullmatch(path.name)
    assert m is not None, path
    return m
