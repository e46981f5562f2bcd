"""``kill_at_file_event``: a SIGKILL at the Nth file event of a save, or in the middle of a write."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from pytest_reshard.chaos._common import target_of, then
from pytest_reshard.contract import MUTATIONS, FileKill
from pytest_reshard.schedule import Fault, ScheduleError
from pytest_reshard.schedule.kinds import Ending, FaultKind, register

if TYPE_CHECKING:  # pragma: no cover
    from pytest_reshard.rank.probe import Run

MODES = tuple(str(m) for m in FileKill if m != FileKill.POWER)   # power: ``power_loss``


def kill_at_file_event(*, at_step: int, event: int | None = None, mode: str = "before",
                       rank: int | None = 0, path: str | None = None, op: str | None = None,
                       target: str | None = None, tear_bytes: int | None = None,
                       then_world_size: int | None = None) -> Fault:
    """SIGKILL the rank at the ``event``-th file event it makes under the work folder from the
    start of step ``at_step`` on (a save's mkdir, open, write, fsync, close, rename, symlink,
    unlink, rmtree..., from any thread: an async save's too): before the event happens
    (``mode="before"``), or, for a ``write``, once ``tear_bytes`` of the file are written
    (``mode="torn"``; default half of its first ``write()``), the rest never written. Or, for a
    ``close`` (``mode="flip"``): the save completes, one byte in the middle of that file is
    inverted (what a bad disk or a bad copy does), and the rank dies at its next save, so the
    next generation resumes from the corrupted checkpoint: a run that does not notice fails.

    Instead of a count, ``path=`` names the file: the first event from the start of ``at_step``
    on a path in the work folder that ends with it (``"model.safetensors"``,
    ``"ckpt/latest"``), of ``op`` if given (``"open"``, ``"write"``, ``"rename"``, ...). A save
    that writes another file first then does not move the point, as a count taken from a
    recording would.

    The workload marks nothing: the probe sees its file system calls (``pytest_reshard.filewatch``
    says how, and which calls it cannot see). ``pytest_reshard.sweep`` enumerates every event of
    one save from a clean run and builds one fault per event and mode.

    Layer: a real SIGKILL between two system calls of the save, or after half of a file's bytes;
    proves the resume takes the newest checkpoint that was complete at the crash and that no
    incomplete one is ever loaded. Does not model a power loss (the kernel keeps every byte
    written, fsynced or not) or a crash of the storage server.
    """
    if mode not in MODES:
        raise ScheduleError(f"kill_at_file_event mode must be one of {MODES}, got {mode!r}")
    params: dict[str, Any] = {"mode": mode, **then(then_world_size), **at_file(event, path, op)}
    if tear_bytes is not None:
        params["tear_bytes"] = int(tear_bytes)
    return Fault("kill_at_file_event", target_of(rank, None, target, "one"), at_step, "begin",
                 params)


def at_file(event: int | None, path: str | None, op: str | None) -> dict[str, Any]:
    """The params that name a file event: its count, or its path (and operation)."""
    if (event is None) == (path is None):
        raise ScheduleError("name the file event by event= (its count from the start of "
                            "at_step) or by path= (and op=), one of them")
    if path is None:
        if op is not None:
            raise ScheduleError("op= goes with path=; event= counts every operation")
        if int(event) < 1:   # type: ignore[arg-type]
            raise ScheduleError(f"a file event counts from 1, got {event!r}")
        return {"event": int(event)}   # type: ignore[arg-type]
    if op is not None and op not in {str(o) for o in MUTATIONS}:
        raise ScheduleError(f"op must be a file operation ({', '.join(map(str, MUTATIONS))}), "
                            f"got {op!r}")
    return {"path": str(path).strip("/"), **({"op": op} if op is not None else {})}


def matcher(params: Mapping[str, Any]) -> tuple[str, str | None] | None:
    """What ``Watcher.arm`` matches for params made by ``at_file``."""
    return (params["path"], params.get("op")) if "path" in params else None


def execute(run: Run, fault: Mapping[str, Any]) -> None:
    p = fault["params"]
    run.watch_files().arm(p.get("event", 0), p["mode"], p.get("tear_bytes", 0),
                          match=matcher(p))


register(FaultKind("kill_at_file_event", execute=execute, ending=Ending.DEATH, watches_files=True,
                   label="file-event kill", doc=kill_at_file_event.__doc__ or ""))
