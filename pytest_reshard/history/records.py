"""What a history is made of: one frozen record per kind of fact, decoded from the raw events.

``History`` (``history.queries``) is the only reader of raw event dicts; everything it hands out
is one of these records, with the contract's enums (``Cause``, ``Detected``, ``FileOp``,
``MemberAction``) where the events carry a name from a closed set.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Mapping, TypeVar, Union, overload

from pytest_reshard.contract import SUPERVISOR_EVENTS, Cause, Detected, Ev, FileOp, MemberAction

__all__ = [
    "Event", "ScenarioRecord", "Generation", "Occurrence", "Checkpoint", "FaultFired",
    "Detection", "RankMemory", "StepSpan", "Attempt", "Replay", "FileEvent", "Saved", "Begun",
    "Ended", "Started", "Point", "StepError", "Signal", "Exit", "Note", "Unfired", "Abort",
    "Delivery", "RssSample", "MemberEvent", "RankRecord", "file_trail", "decode", "SAVE", "LOAD",
]

Event = Mapping[str, Any]
E = TypeVar("E", bound=enum.Enum)


def as_enum(kind: type[E], value: Any) -> Any:
    """``value`` as a member of ``kind`` when it names one; otherwise as recorded (a name the
    contract does not know, from a newer writer or a hand-built history, still compares)."""
    try:
        return kind(value)
    except ValueError:
        return value


@dataclass(frozen=True)
class ScenarioRecord:
    """What the run was asked to do (the supervisor's ``scenario`` event)."""

    workload: str
    steps: int
    world_size: int
    seed: int
    schedule: Mapping[str, Any]
    schedule_hash: str | None
    replay: str | None
    backend: str = "gloo"
    launcher: str = "fork"
    memory_budget_bytes: int | None = None

    def fault(self, fault_id: int | None) -> Mapping[str, Any] | None:
        faults = self.schedule.get("faults", [])
        if fault_id is None or not 0 <= fault_id < len(faults):
            return None
        fault: Mapping[str, Any] = faults[fault_id]
        return fault


@dataclass(frozen=True)
class Generation:
    """One launch of the ranks, from the supervisor's view and the ranks' own events."""

    gen: int
    world_size: int
    roles: tuple[str, ...]
    launcher: str | None
    resume_step: int | None      # declared by ``resumed`` (lowest rank value), else first begun step
    resume_declared: bool
    resume_source: str | None
    cause: Cause | str | None    # gen_end cause; None when the supervisor recorded no end
    planned: bool                # gen_end planned; False when unknown
    fault_id: int | None
    detail: str
    started_at: float | None = None  # the supervisor's gen_start time; None when it recorded none
    ended_at: float | None = None    # the supervisor's gen_end time; None when it recorded none

    @property
    def ended(self) -> bool:
        return self.cause is not None


@dataclass(frozen=True, order=True)
class Occurrence:
    """One execution of ``step`` in generation ``gen``."""

    step: int
    gen: int


#: A ``Checkpoint``'s ``kind``; ``STATE``: the live state after a step (``Run.state_after``).
SAVING, SAVE, LOAD, STATE = "saving", "save", "load", "state"


@dataclass(frozen=True)
class Checkpoint:
    """A ``ckpt_saving``, ``ckpt_save``, ``ckpt_load`` or ``state`` event of one rank."""

    kind: str                    # SAVING | SAVE | LOAD | STATE
    gen: int
    rank: int
    step: int
    digest: Mapping[str, str]
    expected: Mapping[str, str] | None
    t: float
    index: int                   # position in the history, to order events without clocks
    seconds: float | None = None  # how long the save or load took, when the workload said
    bytes: int | None = None     # how much it wrote or read, when the workload said
    info: Mapping[str, Any] = field(default_factory=dict)  # the workload's other fields
    # (world_size, source, saved_world_size, kind="emergency", ...)


@dataclass(frozen=True)
class FaultFired:
    """A fault fired on a rank (its ``fault`` event)."""

    gen: int
    rank: int
    step: int
    phase: str
    kind: str
    id: int | None
    params: Mapping[str, Any]
    t: float | None = None       # when it fired on this rank


@dataclass(frozen=True)
class Detection:
    """The supervisor noticed a rank die, stop, stall or exit early."""

    gen: int
    kind: Detected | str         # what the supervisor noticed
    rank: int | None
    step: int | None
    phase: str | None
    exit_code: int | None
    latency_s: float | None
    expected: bool
    detail: str = ""
    t: float | None = None       # when the supervisor recorded it


@dataclass(frozen=True)
class RankMemory:
    """One rank's memory over the whole run: its highest peak RSS (the supervisor samples VmHWM
    of every generation's process), the per-rank budget, the device peak, size and reserved peak
    the workload reported (``run.memory(peak, budget_bytes=, reserved_bytes=)``; CUDA on GPU),
    and the highest unique and proportional sets (USS, PSS) it had at a clean exit."""

    rank: int
    peak_bytes: int | None
    budget_bytes: int | None
    device_peak_bytes: int | None = None
    device_total_bytes: int | None = None
    uss_bytes: int | None = None
    pss_bytes: int | None = None
    device_reserved_bytes: int | None = None

    @property
    def headroom_bytes(self) -> int | None:
        return None if self.peak_bytes is None or not self.budget_bytes \
            else self.budget_bytes - self.peak_bytes

    @property
    def device_headroom_bytes(self) -> int | None:
        return None if self.device_peak_bytes is None or not self.device_total_bytes \
            else self.device_total_bytes - self.device_peak_bytes


@dataclass(frozen=True)
class StepSpan:
    """One rank's run of one step in one generation, from its ``begin`` to its ``end``."""

    gen: int
    rank: int
    step: int
    begin_t: float
    end_t: float | None          # None: begun, never ended (in flight when the rank stopped)

    @property
    def done(self) -> bool:
        return self.end_t is not None

    @property
    def seconds(self) -> float | None:
        return None if self.end_t is None else self.end_t - self.begin_t


@dataclass(frozen=True)
class Attempt:
    """One ``begin`` of a step on one rank, in membership mode: which incarnation of the rank
    (0 for the first ``start``), whether it ended, and what it recorded."""

    gen: int
    rank: int
    incarnation: int
    step: int
    begin_index: int             # positions in ``History.events`` (ordered by time)
    end_index: int | None        # None: it raised, or the rank died in it
    start_index: int = -1        # where its incarnation's ``start`` is
    samples: tuple[tuple[int, int], ...] = ()
    quorum: Any = None           # the membership epoch the workload recorded (``quorum=``)
    participants: int | None = None  # replica groups in that quorum (``participants=``)
    participating: bool | None = None  # False: its gradient was zeroed (a group still healing)
    phase: str = "begin"         # the last fault point it reached

    @property
    def ended(self) -> bool:
        return self.end_index is not None


@dataclass(frozen=True)
class Replay:
    """A committed step executed and ended again later, in a membership generation."""

    gen: int
    rank: int
    incarnation: int
    step: int
    committed_index: int         # when the step was first committed (every rank of a group ended it)



@dataclass(frozen=True)
class FileEvent:
    """A rank's file event under the work folder (``filewatch``; the fields as the contract
    names them). Values other than ``op`` are kept as recorded."""

    gen: int
    rank: int
    op: FileOp | str
    path: str
    n: Any = None                # the count a kill_at_file_event fires at
    at_step: Any = None          # the step begun last (None: before the first)
    dst: Any = None              # a rename's or copy's destination
    raw: Any = None              # an open through a raw descriptor: no size or CRC on record
    offset: Any = None           # a write's offset
    size: Any = None             # at a close
    crc: Any = None              # at a close
    written: Any = None          # bytes written, at an fsync or close
    killed: Any = None           # a FileKill: the event a kill fired at
    tear_bytes: Any = None
    flip: Any = None             # True on the event a flip fired at
    target: Any = None           # a symlink's target
    existed: Any = None          # an open for writing: the size of the file already there
    append: Any = None           # an open for writing that keeps the file's bytes
    folder: Any = None           # an fsync of a folder
    kept: Any = None             # a rename: the hard link kept of the file it replaced
    t: float = 0.0


@dataclass(frozen=True)
class Saved:
    """A rank recorded a completed save of the state after ``step`` (in a file trail)."""

    gen: int
    rank: int
    step: int


@dataclass(frozen=True)
class Begun:
    """A rank began ``step``."""

    gen: int
    rank: int
    step: int
    t: float = 0.0


@dataclass(frozen=True)
class Ended:
    """A rank ended ``step``."""

    gen: int
    rank: int
    step: int
    t: float = 0.0


@dataclass(frozen=True)
class Started:
    """A rank attached (``probe.attach``): each one begins an incarnation."""

    gen: int
    rank: int
    t: float = 0.0


@dataclass(frozen=True)
class Point:
    """A rank reached a fault point inside a step."""

    gen: int
    rank: int
    step: int
    phase: Any
    t: float = 0.0


@dataclass(frozen=True)
class StepError:
    """A step raised on a rank."""

    gen: int
    rank: int
    step: int
    phase: Any
    error: Any
    t: float = 0.0


@dataclass(frozen=True)
class Signal:
    """A signal the probe saw land (or, ``armed``, the record that its flag was installed)."""

    gen: int
    rank: int
    signal: Any
    armed: bool
    t: float = 0.0


@dataclass(frozen=True)
class Exit:
    """A rank's clean exit (``run.close()``)."""

    gen: int
    rank: int
    code: Any = None
    peak_rss: Any = None
    sigterm_replaced: Any = None
    t: float = 0.0


@dataclass(frozen=True)
class Note:
    """A free-form note of a rank: ``what`` names it, ``fields`` holds the rest as recorded."""

    gen: int
    rank: int
    what: Any
    step: Any
    fields: Mapping[str, Any]
    t: float = 0.0


@dataclass(frozen=True)
class Unfired:
    """A scheduled fault that never fired (the supervisor's ``unfired``)."""

    fault_id: Any
    detail: Any
    t: float | None = None


@dataclass(frozen=True)
class Abort:
    """The supervisor gave up on the run."""

    detail: Any
    t: float | None = None


@dataclass(frozen=True)
class Devices:
    """A heterogeneous world's generation (``Scenario.devices``): each rank's device class, its
    speed relative to an H100 (``devices.REFERENCE``, the same in every generation), and how that
    was made real (``cgroup``, ``stretch``) or read (``gpu``: the ranks' own GPUs)."""

    gen: int
    classes: tuple[str, ...]
    speeds: tuple[float, ...]
    mode: str
    why: str = ""
    period_s: float | None = None   # a cgroup cap's quota period (its CPU time comes per period)


@dataclass(frozen=True)
class PowerLoss:
    """What a power loss took from the work folder (``power_loss``): ``reasons`` says why, per
    path (a folder: everything under it)."""

    gen: int
    renames_undone: tuple[tuple[str, str], ...]   # (dst, src), newest first
    removed: tuple[str, ...]
    cut: Mapping[str, int]
    reasons: Mapping[str, str]
    not_judged: tuple[str, ...]
    problems: tuple[str, ...]
    t: float | None = None

    def why(self, path: str) -> str | None:
        for where, reason in self.reasons.items():
            if path == where or path.startswith(where + "/"):
                return f"`{where}`: {reason}"
        return None


@dataclass(frozen=True)
class Delivery:
    """A scheduler delivered a planned fault (SLURM's scancel)."""

    gen: int
    fault_id: Any
    kind: Any
    grace_s: Any
    t: float | None = None


@dataclass(frozen=True)
class RssSample:
    """The supervisor's sample of a rank's peak RSS."""

    gen: Any
    rank: int
    peak_bytes: int
    budget_bytes: Any
    t: float | None = None


@dataclass(frozen=True)
class MemberEvent:
    """A membership-mode record of the supervisor; ``fields`` holds its other fields as
    recorded (groups, ranks, incarnation, ...)."""

    action: MemberAction | str
    gen: Any
    fields: Mapping[str, Any]
    t: float | None = None


#: What ``decode`` makes of a rank event (None for the kinds without a record of their own).
RankRecord = Union[FileEvent, Saved, Begun, Ended, Started, Point, StepError, Signal, Exit,
                   Note, FaultFired]


def _t(e: Event) -> float:
    return float(e.get("t", 0.0))


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def _opt_number(v: Any) -> Any:
    """A number as recorded (an int stays an int, so what is computed from it does not change),
    else None."""
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def file_event(e: Event) -> FileEvent:
    return FileEvent(gen=e["gen"], rank=e["rank"], op=as_enum(FileOp, e["op"]), path=e["path"],
                     n=e.get("n"), at_step=e.get("at_step"), dst=e.get("dst"), raw=e.get("raw"),
                     offset=e.get("offset"), size=e.get("size"), crc=e.get("crc"),
                     written=e.get("written"), killed=e.get("killed"),
                     tear_bytes=e.get("tear_bytes"), flip=e.get("flip"), target=e.get("target"),
                     existed=e.get("existed"), append=e.get("append"), folder=e.get("folder"),
                     kept=e.get("kept"), t=_t(e))


def fault_fired(e: Event) -> FaultFired:
    return FaultFired(gen=int(e["gen"]), rank=int(e["rank"]), step=int(e["step"]),
                      phase=str(e.get("phase", "")), kind=str(e.get("kind", "")),
                      id=_opt_int(e.get("id")), params=dict(e.get("params") or {}),
                      t=_opt_float(e.get("t")))


def decode(e: Event) -> RankRecord | None:
    """The record of one rank event, or None for a kind without one (``record``, ``notice``,
    ``memory``, ...: read through ``History``'s queries)."""
    ev = e["ev"]
    if ev in SUPERVISOR_EVENTS:
        return None
    gen, rank = e["gen"], e["rank"]
    if ev == Ev.FILE:
        return file_event(e)
    if ev == Ev.CKPT_SAVE:
        return Saved(gen, rank, int(e["step"]))
    if ev == Ev.BEGIN:
        return Begun(gen, rank, int(e["step"]), _t(e))
    if ev == Ev.END:
        return Ended(gen, rank, int(e["step"]), _t(e))
    if ev == Ev.START:
        return Started(gen, rank, _t(e))
    if ev == Ev.POINT:
        return Point(gen, rank, int(e["step"]), e.get("phase"), _t(e))
    if ev == Ev.ERROR:
        return StepError(gen, rank, int(e["step"]), e.get("phase"), e.get("error"), _t(e))
    if ev == Ev.SIGNAL:
        return Signal(gen, rank, e.get("signal"), bool(e.get("armed")), _t(e))
    if ev == Ev.EXIT:
        return Exit(gen, rank, e.get("code"), e.get("peak_rss"), e.get("sigterm_replaced"), _t(e))
    if ev == Ev.NOTE:
        return Note(gen, rank, e.get("what"), e.get("step"), dict(e), _t(e))
    if ev == Ev.FAULT:
        return fault_fired(e)
    return None



_RECORDS = (FileEvent, Saved, Begun, Ended, Started, Point, StepError, Signal, Exit, Note,
            FaultFired)


@overload
def file_trail(events: Iterable[Event | RankRecord], *, begins: Literal[False] = False
               ) -> list[FileEvent | Saved]: ...
@overload
def file_trail(events: Iterable[Event | RankRecord], *, begins: bool
               ) -> list[FileEvent | Saved | Begun]: ...
def file_trail(events: Iterable[Event | RankRecord], *, begins: bool = False
               ) -> list[FileEvent | Saved] | list[FileEvent | Saved | Begun]:
    """The file events and save records among ``events`` (raw rank events or records), in
    order; with ``begins``, each step's ``Begun`` too. What the file checkers and the sweep read."""
    out: list[FileEvent | Saved | Begun] = []
    for e in events:
        r = e if isinstance(e, _RECORDS) else decode(e)
        if isinstance(r, (FileEvent, Saved)) or (begins and isinstance(r, Begun)):
            out.append(r)
    return out
