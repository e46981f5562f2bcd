"""What a power loss leaves of the work folder: every write since its file's last fsync undone,
every rename whose folder was not synced since undone (``power_loss``).

``undo_of`` is a pure function of one generation's file events (all ranks, the cut among them);
``apply`` does it to the folder once every rank is dead. The model is POSIX's pessimistic one:

- a file's bytes are durable up to the size of its last fsync before the cut; one never synced
  has none: removed if nothing made its name durable either (its own fsync, or an fsync of its
  folder after it was made), else left empty;
- a file that was there before the generation is durable as it was: opened to append it goes
  back to its old size, opened to truncate it is left empty (the truncation is metadata, the
  new bytes are not);
- a rename is durable once its destination folder is synced after it; otherwise it is undone,
  newest first, and the file it replaced comes back from the hard link the rank kept.

Not modelled (named in ``not_judged``): files written through a raw descriptor, and the undo of
an unlink, rmtree, mkdir, truncate, copy or link.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from pytest_reshard.contract import OUTSIDE, Ev, FileKill, FileOp, name_of

__all__ = ["Undo", "undo_of", "apply"]

_UNMODELLED = (FileOp.TRUNCATE, FileOp.COPY, FileOp.LINK)


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top + "/")


def _moved(path: str, src: str, dst: str) -> str:
    return dst + path[len(src):] if _under(path, src) else path


@dataclass
class _File:
    why_lost: str               # what the loss of a file made in the generation says
    durable: int | None         # bytes that survive; None: none
    named: bool                 # its name survives
    raw: bool = False
    dirty: bool = False         # written since its last fsync (or since it was there)


@dataclass
class Undo:
    """What the power loss takes: ``renames`` to undo, newest first, as ``(dst, src, kept)``;
    then ``removed`` and ``cut`` (``path -> size``), each with why (``reasons``)."""

    renames: list[tuple[str, str, str | None]] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    cut: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    not_judged: list[str] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        """The supervisor's record of it (``Ev.POWER_LOSS``)."""
        return {"renames_undone": [[d, s] for d, s, _ in self.renames], "removed": self.removed,
                "cut": self.cut, "reasons": self.reasons, "not_judged": self.not_judged}


@dataclass(frozen=True)
class _Event:
    op: str
    path: str
    t: float
    dst: Any = None
    raw: Any = None
    size: Any = None
    written: Any = None
    killed: Any = None
    existed: Any = None
    append: Any = None
    folder: Any = None
    kept: Any = None


_FIELDS = ("dst", "raw", "size", "written", "killed", "existed", "append", "folder", "kept")


def undo_of(events: Iterable[dict[str, Any]]) -> Undo:
    """The undo of the generation whose rank events (every rank's) are ``events``; the power
    went at the file event recorded ``killed="power"`` (it never happened, nor did any fsync
    after it)."""
    trail = sorted((_Event(e["op"], e["path"], float(e.get("t") or 0.0),
                           **{k: e.get(k) for k in _FIELDS})
                    for e in events if name_of(e) == Ev.FILE), key=lambda e: e.t)
    cut = next((e.t for e in trail if e.killed == FileKill.POWER), None)
    files: dict[str, _File] = {}
    renames: list[list[Any]] = []          # [src, dst, kept, durable, what it replaced]
    undo = Undo()
    for e in trail:
        if e.killed == FileKill.POWER or (e.killed == FileKill.BEFORE and e.op != FileOp.CLOSE):
            continue                       # it never happened
        after_cut = cut is not None and e.t > cut
        op, path = e.op, e.path
        if op == FileOp.OPEN:
            f = files.get(path)
            if f is None and e.existed is not None and not e.raw:   # there before: durable
                files[path] = _File("", int(e.existed) if e.append else 0, True)
            elif f is None:
                files[path] = _File("never fsynced: lost with the page cache", None, False,
                                    raw=bool(e.raw))
            elif e.raw:
                f.raw = True
            elif not e.append:             # truncated again: its old bytes are gone
                f.durable = 0 if f.named else None
            files[path].dirty = True
        elif op in (FileOp.WRITE, FileOp.CLOSE) and path in files:
            files[path].dirty = files[path].dirty or op == FileOp.WRITE
        elif op == FileOp.SYMLINK:
            files[path] = _File("made, and its folder never fsynced after", None, False)
        elif op == FileOp.FSYNC and not after_cut:
            if e.folder:
                for p, f in files.items():
                    if os.path.dirname(p) == ("" if path == "." else path):
                        f.named = True
                for r in renames:
                    if os.path.dirname(r[1]) == ("" if path == "." else path):
                        r[3] = True
            elif path in files:
                f = files[path]
                f.durable = int(e.size if e.size is not None else e.written or 0)
                f.named, f.dirty = True, False
        elif op == FileOp.RENAME and e.dst and e.dst != OUTSIDE and path != OUTSIDE:
            replaced = {p: files.pop(p) for p in [p for p in files if _under(p, e.dst)]}
            for p in [p for p in files if _under(p, path)]:
                files[_moved(p, path, e.dst)] = files.pop(p)
            renames.append([path, e.dst, e.kept, False, replaced])
        elif op in (FileOp.UNLINK, FileOp.RMTREE, FileOp.RMDIR):
            for p in [p for p in files if _under(p, path)]:
                del files[p]
        elif op in _UNMODELLED:
            undo.not_judged.append(f"{op} {path}: not undone")
    back: set[str] = set()                 # files an undone rename brought back
    for src, dst, kept, durable, replaced in reversed(renames):
        if durable:
            continue
        undo.renames.append((dst, src, kept))
        undo.reasons[dst] = f"renamed from `{src}`, but `{os.path.dirname(dst) or '.'}/` was " \
                            "never fsynced after it: the rename is undone"
        for p in [p for p in files if _under(p, dst)]:
            files[_moved(p, dst, src)] = files.pop(p)
        files.update(replaced)   # back, as durable as it was: its own unsynced bytes are lost
        back.update(replaced)
    for path, f in sorted(files.items()):
        if f.raw:
            undo.not_judged.append(f"{path}: written through a raw descriptor, its bytes unseen")
            continue
        if f.durable is None and not f.named:
            undo.removed.append(path)
            why = f.why_lost
        elif f.dirty:
            undo.cut[path] = f.durable or 0
            why = ("never fsynced: left empty" if not f.durable else
                   f"written after its last fsync at {f.durable} bytes")
        else:
            continue
        said = undo.reasons.get(path)
        undo.reasons[path] = why if said is None else \
            f"{said}; the file it had replaced comes back, and that one was {why}" \
            if path in back else said
    return undo


def apply(undo: Undo, work: Path, replaced: Path) -> list[str]:
    """Do ``undo`` to the work folder; returns what could not be done, each saying why."""
    problems = []
    for dst, src, kept in undo.renames:
        try:
            if os.path.lexists(work / dst):
                os.replace(work / dst, work / src)
            if kept:
                os.link(replaced / kept, work / dst)
        except OSError as e:
            problems.append(f"undo rename {src} -> {dst}: {e}")
    for path in undo.removed:
        target = work / path
        if target.is_dir() and not target.is_symlink():
            continue
        try:
            target.unlink(missing_ok=True)
        except OSError as e:
            problems.append(f"remove {path}: {e}")
    for path, size in undo.cut.items():
        target = work / path
        try:
            if target.is_file() and not target.is_symlink() and target.stat().st_size > size:
                os.truncate(target, size)
        except OSError as e:
            problems.append(f"cut {path} to {size} bytes: {e}")
    shutil.rmtree(replaced, ignore_errors=True)
    return problems
