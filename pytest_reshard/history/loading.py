"""Reading a run folder's event files into one ordered list of raw events, checked line by line."""
from __future__ import annotations

import gc
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from functools import partial
from multiprocessing import get_context
from pathlib import Path
from typing import Callable, Iterator, TypeVar
from pytest_reshard.contract import (RANK_FILE, STEP_EVENTS, SUPERVISOR_EVENTS, Damaged, Ev,
                                     RunDir, Torn, read_jsonl)
from pytest_reshard.history.records import Event
from pytest_reshard.history.streams import RankStream, Recorded, shape_table

__all__ = ["HistoryError", "load_events", "validate", "is_supervisor", "without_gc", "parsing"]


class HistoryError(ValueError):
    """The recorded events cannot be read; the message names the file, line and what to do."""


def load_events(run_dir: str | Path | RunDir) -> tuple[Recorded, list[Torn], list[Damaged], Path]:
    """The events of ``run_dir/events/*.jsonl`` (or ``run_dir/*.jsonl``) ordered by time, the
    torn last lines, the damaged lines (left out), and the run folder. A file at a time: only
    its events are ever held as dicts."""
    root = run_dir if isinstance(run_dir, RunDir) else RunDir(Path(run_dir))
    events_dir = root.events if root.events.is_dir() else root.root
    supervisor_file = root.supervisor_events.name
    if not events_dir.is_dir():
        raise HistoryError(f"{root.root}: no such run directory; pass the folder the run wrote")
    files = sorted(p for p in events_dir.glob("*.jsonl")
                   if p.name == supervisor_file or RANK_FILE.fullmatch(p.name))
    if not files:
        raise HistoryError(f"{events_dir}: no event files (g*-r*.jsonl, {supervisor_file}); "
                           "did the run start any rank?")
    with without_gc():
        return _read(files, root)


@contextmanager
def without_gc() -> Iterator[None]:
    """No cyclic collection inside: a history of millions of objects (no cycles among them)
    would be walked whole by each one, and loading or judging one triggers many."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _read(files: list[Path], root: RunDir) -> tuple[Recorded, list[Torn], list[Damaged], Path]:
    events = Recorded()
    torn: list[Torn] = []
    damaged: list[Damaged] = []
    rank_files = [p for p in files if RANK_FILE.fullmatch(p.name)]
    with parsing(_parse_rank_file, rank_files) as parsed:
        for path in files:
            if RANK_FILE.fullmatch(path.name):
                stream, shapes, file_torn, file_damaged = next(parsed)
                events.adopt(stream, shapes)
                torn += file_torn
                damaged += file_damaged
                continue
            file_events, file_torn, file_damaged = read_jsonl(path)
            torn += file_torn
            damaged += file_damaged
            for lineno, e in file_events:
                try:
                    validate(e)
                    if not is_supervisor(e):
                        raise HistoryError(f"rank event {e['ev']!r} in the supervisor's file")
                except HistoryError as err:
                    damaged.append(Damaged(str(path), lineno, str(err)))
                    continue
                events.add(e, float(e.get("t", 0.0)))
    events.order(by_key=True)  # stable: file order within equal times
    return events, torn, damaged, root.root


#: Rank files of more bytes than this in all are parsed by a pool of processes, one per CPU: a
#: thousand ranks' history holds millions of events, and parsing them is most of judging them.
PARALLEL_BYTES = 64 << 20

_T = TypeVar("_T")


@contextmanager
def parsing(parse: Callable[..., _T], files: list[Path]) -> Iterator[Iterator[_T]]:
    """``parse(path)`` of each file, in order: here, or ``parse(path, apart=True)`` in a pool of
    processes when the files are big and this machine has CPUs to spare (``parse`` must be a
    module's function, and what it returns must pickle)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    # Forked: spawned processes would run the caller's main script again. Forking is safe only
    # in a process that runs no other thread (a session loading its reference runs on one is).
    if cpus < 2 or threading.active_count() > 1 or not hasattr(os, "fork") \
            or sum(p.stat().st_size for p in files) < PARALLEL_BYTES:
        yield map(parse, files)
        return
    with ProcessPoolExecutor(cpus, mp_context=get_context("fork")) as pool:
        yield pool.map(partial(parse, apart=True), files, chunksize=max(1, len(files) // (8 * cpus)))


def _parse_rank_file(path: Path, *, apart: bool = False) -> tuple[
        RankStream, list[tuple[str, ...]] | None, list[Torn], list[Damaged]]:
    """A rank file as a stream, its torn last line and its damaged lines (those it refused
    among them); ``apart``: in a process of the pool, whose ``shape_table()`` comes too."""
    m = RANK_FILE.fullmatch(path.name)
    assert m is not None
    gen, rank = int(m.group(1)), int(m.group(2))
    file_events, torn, damaged = read_jsonl(path)
    stream = RankStream(gen, rank)
    refused = stream.take(file_events, partial(_in_rank_file, gen=gen, rank=rank))
    damaged += [Damaged(str(path), lineno, why) for lineno, why in refused]
    return stream, shape_table() if apart else None, torn, damaged


def _in_rank_file(e: Event, gen: int, rank: int) -> None:
    validate(e)
    if is_supervisor(e):
        raise HistoryError(f"supervisor event {e['ev']!r} in a rank's file")
    if (e["gen"], e["rank"]) != (gen, rank):
        raise HistoryError(f"event of generation {e['gen']} rank {e['rank']} in the file of "
                           f"generation {gen} rank {rank}")


def validate(e: Event) -> None:
    """Raise ``HistoryError`` unless ``e`` carries what its kind needs (``gen``, ``rank``,
    ``step``, a numeric ``t``)."""
    ev = e.get("ev")
    if not isinstance(ev, str):
        raise HistoryError(f"event has no 'ev' kind: {dict(e)!r}")
    if not isinstance(e.get("t", 0.0), (int, float)):
        raise HistoryError(f"{ev} event's 't' is not a number: {dict(e)!r}")
    if ev not in SUPERVISOR_EVENTS:
        for key in ("gen", "rank"):
            if not isinstance(e.get(key), int):
                raise HistoryError(f"{ev} event needs an integer {key!r}: {dict(e)!r}")
        if ev in STEP_EVENTS and not isinstance(e.get("step"), int):
            raise HistoryError(f"{ev} event needs an integer 'step': {dict(e)!r}")
    elif ev in _GEN_EVENTS and not isinstance(e.get("gen"), int):
        raise HistoryError(f"supervisor {ev} event needs an integer 'gen': {dict(e)!r}")


#: Supervisor events that belong to one generation.
_GEN_EVENTS = frozenset({Ev.GEN_START, Ev.GEN_END, Ev.DETECT, Ev.DELIVER})


def is_supervisor(e: Event) -> bool:
    return e["ev"] in SUPERVISOR_EVENTS
