"""What the watch loop notices about single ranks: a stopped rank, a memory budget crossed, when
a rank last showed life; and the ``detect`` record that names it."""
from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING

from pytest_reshard.contract import Detected, Ev, lost_writes, name_of
from pytest_reshard.schedule import kinds
from pytest_reshard.supervisor.outcome import Failure

if TYPE_CHECKING:  # pragma: no cover
    from pytest_reshard.supervisor.watch import Watch

__all__ = ["RankWatch", "record_detection", "ends", "STOP_CONFIRM_S"]

#: How long the kernel must hold a rank stopped (SIGSTOP) before it is named: one heartbeat
#: period, so a rank continued at once (SIGCONT) is never called stopped.
STOP_CONFIRM_S = 0.1


def ends(ev: dict, ending: kinds.Ending) -> bool:
    """A fault event whose kind ends its victim this way (with these params)."""
    return name_of(ev) == Ev.FAULT and kinds.ending_of(ev["kind"], ev["params"]) is ending


def _where(step: int | None, phase: str | None) -> str:
    return f"at step {step}, phase {phase}" if step is not None else "before its first step"


def record_detection(loop: Watch, kind: Detected, rank: int, *, expected: bool,
                     code: int | None = None, since: float | None = None) -> str:
    """Record that the supervisor noticed ``kind`` about ``rank``; returns it in words."""
    step, phase = loop.tail.last_position(loop.gen, rank)
    latency = None if since is None else round(time.time() - since, 4)
    loop.record(Ev.DETECT, gen=loop.gen, kind=kind.value, rank=rank, step=step, phase=phase,
                exit_code=code, latency_s=latency, expected=expected)
    where = _where(step, phase)
    return {Detected.DIED: f"rank {rank} died (exit code {code}) {where}",
            Detected.STOPPED: f"rank {rank} stopped responding {where}",
            Detected.STALLED: f"no rank made progress for {loop.sc.stall_s:.0f} s; rank "
                              f"{rank} was last seen {where}",
            Detected.EXITED_EARLY: (f"rank {rank} exited with code 0 {where} without a "
                                    "planned event" if not code else
                                    f"rank {rank} closed its run {where}, then exited with code "
                                    f"{code}, without a planned event"),
            Detected.PARTITIONED: f"rank {rank} was partitioned {where}: its node, cut off "
                                  "the network, was fenced once a peer failed",
            }[kind] + f" (generation {loop.gen})"


class RankWatch:
    """Per-rank observations of one generation's loop: peak memory, how long each has been
    stopped, which rank a fault fired on."""

    def __init__(self, loop: Watch) -> None:
        self.loop = loop
        self.stopped_since: dict[int, float] = {}  # rank -> when /proc first said T
        self.peaks: dict[int, int] = {}  # rank -> peak RSS bytes seen
        self.beats: dict[int, tuple[float, float]] = {}  # rank -> (last beat, monotonic when seen)

    def faulted(self, ending: kinds.Ending) -> int | None:
        """The rank a fault that ends its victim this way fired on, in this generation."""
        for (gen, rank), evs in self.loop.tail.by_rank.items():
            if gen == self.loop.gen and any(ends(e, ending) for e in evs):
                return rank
        return None

    def last_event_t(self, rank: int) -> float:
        events = self.loop.tail.events(self.loop.gen, rank)
        return events[-1]["t"] if events else float("inf")

    def watch_memory(self, codes: dict[int, int | None]) -> None:
        """Track each rank's peak RSS; past the budget, end the rank as the OOM killer would."""
        loop = self.loop
        live, budget = loop.live, loop.sc.memory_budget_bytes
        for rank, pid in live.pids().items():
            if codes.get(rank) is not None:
                continue
            peak = live.peak_rss(rank, pid)
            if peak is None:
                continue
            self.peaks[rank] = max(peak, self.peaks.get(rank, 0))
            if budget and peak > budget and loop.failure is None:
                live.signal(rank, signal.SIGKILL)
                step, phase = loop.tail.last_position(loop.gen, rank)
                detail = (f"rank {rank} exceeded its memory budget {_where(step, phase)}: peak RSS "
                          f"{peak / 2**20:.0f} MiB > budget {budget / 2**20:.0f} MiB; "
                          f"killed it as the OOM killer would")
                loop.record(Ev.DETECT, gen=loop.gen, kind=Detected.OOM.value, rank=rank,
                            step=step, phase=phase, exit_code=-signal.SIGKILL, latency_s=None,
                            expected=False, detail=detail)
                loop.settle([rank])
                loop.failure = Failure(rank, -signal.SIGKILL, time.monotonic(), detail)

    def last_beat(self, rank: int) -> float | None:
        """When the rank last showed life: its launcher knows (a remote rank's last line), else
        its heartbeat file's mtime; None before it attached."""
        beat = self.loop.live.last_beat(rank)
        if beat is not None:
            return beat
        try:
            return os.path.getmtime(self.loop.ctx.run_dir.heartbeat(self.loop.gen, rank))
        except FileNotFoundError:
            return None

    def refused_write(self, codes: dict[int, int | None]) -> tuple[int, int] | None:
        """``(rank, errno)`` of a rank whose events file refused a write (its heartbeat says so,
        ``contract.lost_writes``), else None."""
        for rank in codes:
            try:
                lost = lost_writes(os.stat(self.loop.ctx.run_dir.heartbeat(self.loop.gen, rank)))
            except FileNotFoundError:
                continue
            if lost is not None:
                return rank, lost
        return None

    def silent_for(self, rank: int) -> float | None:
        """Seconds since the rank's heartbeat last moved, on this machine's monotonic clock: a
        step of the wall clock (NTP, a VM resumed) moves every beat's time at once, and must not
        make a live rank look stopped. None before it attached."""
        beat = self.last_beat(rank)
        if beat is None:
            return None
        mono = time.monotonic()
        seen = self.beats.get(rank)
        if seen is None:   # first sight: its age by the wall clock, the only one there is
            self.beats[rank] = (beat, mono - max(0.0, time.time() - beat))
        elif seen[0] != beat:
            self.beats[rank] = (beat, mono)
        return mono - self.beats[rank][1]

    def stopped(self, codes: dict[int, int | None]) -> int | None:
        """A live rank that does not run: the kernel has held it stopped by a signal (state T,
        SIGSTOP) for ``STOP_CONFIRM_S``, or its heartbeat is silent for ``hang_s`` while the
        kernel says it is stopped or traced, or silent for ``10 * hang_s`` (at least 10 s)
        whatever /proc says: a busy machine or a long import holding the GIL can delay a
        heartbeat, and a false "stopped" is a false verdict. State T comes only from a signal,
        never from load, so it needs no heartbeat to be believed."""
        loop = self.loop
        mono = time.monotonic()
        hang_s = loop.sc.hang_s
        pids = loop.live.pids()
        for rank, code in codes.items():
            if code is not None:
                continue
            if loop.tail.closed(loop.gen, rank):
                continue  # its interpreter is exiting, and the heartbeat with it
            state = loop.live.state(rank, pids.get(rank))
            if state == "T":
                since = self.stopped_since.setdefault(rank, mono)
                if mono - since >= STOP_CONFIRM_S:
                    return rank
            else:
                self.stopped_since.pop(rank, None)
            age = self.silent_for(rank)
            if age is None:
                continue  # not attached yet: covered by the startup limit
            if age > hang_s and (state in ("T", "t") or age > max(10 * hang_s, 10.0)):
                return rank
        return None
