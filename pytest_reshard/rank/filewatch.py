"""File events of a rank: what a save really does on disk, seen from inside the process.

The workload marks nothing. Once installed (the plan asks it to record, or a
``kill_at_file_event`` fault arms it), every file system call under the run's work folder is an
event in the rank's history, in the order it happened, from any thread:

- **CPython audit hooks** see ``open`` for writing, ``os.rename``/``os.replace``, ``os.remove``
  (``unlink``), ``os.rmdir``, ``os.mkdir`` (``makedirs``), ``shutil.rmtree``, ``os.symlink``,
  ``os.link``, ``os.truncate`` and ``shutil.copyfile``; ``pathlib`` goes through them too. Opens
  for reading are recorded (``read``: what a resume looked at) but never counted.
- **Wrappers** for what raises no audit event: ``builtins.open``/``io.open`` return a thin proxy
  for a file opened for writing, which reports its ``write`` (all writes until the next fsync or
  close are one event) and ``close``; ``os.fsync``/``os.fdatasync`` of such a file is ``fsync``.
- **Native writers** (``torch.save`` to a path, ``safetensors.torch.save_file``) write from C++ or
  Rust: the wrapper reports ``open``, ``write`` and ``close`` around the original call, which
  still writes the file itself (the bytes are exactly production's). A kill "before" the write
  leaves the file created and empty; a torn write is the whole file cut to the torn length
  afterwards, the state a kill mid-write leaves. safetensors 0.8 and later write a
  ``.tmpXXXXXX`` beside the file and rename it into place (no fsync): the wrapper has the
  original write that temporary file and renames it itself, so a crash leaves what a crash of
  the real writer leaves (a torn or whole temporary, never a torn final file). Both are patched
  as soon as torch / safetensors is imported, and every name an imported module already bound
  to them is rebound.

Not seen: writes through a raw descriptor (``os.open`` + ``os.write``, ``io.FileIO``,
``tempfile``'s files: their ``open`` is seen, their writes and close are not), ``mmap``, other
native writers, the files of child processes and the unlinks inside one ``rmtree`` (it is one
event). An fsync of any descriptor under the folder is seen (``/proc/self/fd`` names it), a
folder's too. The crash is a process kill, where the kernel keeps every byte written; for a
power loss (``power_loss``) the events carry what the harness needs to undo what was not
durable: an open for writing names the size of a file that was already there (``existed``) and
whether it kept its bytes (``append``); an fsync names the file's size (``size``) or that it
synced a folder (``folder``); a rename over a file first keeps a hard link to the file it
replaces (``kept``), so an undone rename can bring it back.

Each event is one ``{"ev": "file", "op": ..., "path": ...}`` line in the rank's events file
(paths relative to the work folder; ``close`` carries the file's ``size`` and ``crc`` (CRC-32);
an ``open`` with ``raw`` is one whose writes and close are not seen).
"""
from __future__ import annotations

import builtins
import io
import os
import signal
import stat
import sys
import threading
import zlib
from pathlib import Path
from typing import Any, Callable

from pytest_reshard.contract import MUTATIONS, OUTSIDE, FileKill, FileOp

__all__ = ["install", "snapshot", "MUTATIONS"]


# audit event -> (op, how many leading path arguments)
_AUDITED = {"os.rename": (FileOp.RENAME, 2), "os.remove": (FileOp.UNLINK, 1), "os.rmdir": (FileOp.RMDIR, 1),
            "os.mkdir": (FileOp.MKDIR, 1), "shutil.rmtree": (FileOp.RMTREE, 1), "os.symlink": (FileOp.SYMLINK, 2),
            "os.link": (FileOp.LINK, 2), "os.truncate": (FileOp.TRUNCATE, 1), "shutil.copyfile": (FileOp.COPY, 2),
            "open": (FileOp.OPEN, 1)}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_CHUNK = 1 << 20

_WATCHER: "Watcher | None" = None
_ORIGINAL_OPEN = io.open


def install(root: Path, emit: Callable[..., None], step: Callable[[], int | None]) -> "Watcher":
    """Watch the files under ``root`` in this process (once: later calls return the same one).
    ``emit(**fields)`` writes one event; ``step()`` is the step in progress, for the record."""
    global _WATCHER
    if _WATCHER is None:
        _WATCHER = Watcher(root, emit, step)
        _WATCHER._hook()
    return _WATCHER


class Watcher:
    """Counts and records the file events under one folder, and kills at the armed one."""

    def __init__(self, root: Path, emit: Callable[..., None], step: Callable[[], int | None]) -> None:
        self.root = os.path.realpath(root)
        self._emit = emit
        self._step = step
        self._lock = threading.RLock()
        self._local = threading.local()     # .busy: inside our own wrapper (its open is ours)
        self.count = 0                      # mutations since the last arm()
        self._kill_at: int | None = None
        self._mode = FileKill.BEFORE
        self._flip_then_kill: int | None = None   # flipped a byte after this step's save
        self._flipped = False
        self._flip_path: str | None = None
        self._tear_bytes = 0
        self._fds: dict[int, _WatchedFile] = {}  # descriptor -> its file, for fsync
        self._power_off: Callable[[], None] | None = None
        self._match: tuple[str, str | None] | None = None   # arm(match=): a path, not a count
        self._keep: str | None = None       # keep_replaced's folder

    # -- arming -----------------------------------------------------------------------------
    def arm(self, event: int, mode: str, tear_bytes: int = 0,
            power_off: Callable[[], None] | None = None,
            match: tuple[str, str | None] | None = None) -> None:
        """Kill this process at the ``event``-th file mutation from now (or, with ``match=(path,
        op)``, at the first one on a path that ends with ``path``, of ``op`` if given): before it
        happens (``mode="before"``), or, for a ``write``, once ``tear_bytes`` of the file are
        written (``"torn"``); or, for a ``close``, flip a byte of that file once it is closed and
        kill at the first file event of a later step (``"flip"``); or cut the power before it
        (``"power"``: ``power_off()`` kills every process of the machine at once)."""
        with self._lock:
            self.count = 0
            self._kill_at = int(event) if match is None else None
            self._mode, self._tear_bytes = FileKill(mode), int(tear_bytes)
            self._power_off, self._match = power_off, match

    def _matches(self, op: FileOp, path: str) -> bool:
        if self._match is None or self._kill_at is not None:
            return False
        suffix, wanted = self._match
        return (wanted is None or op == wanted) and (path == suffix or path.endswith("/" + suffix))

    def keep_replaced(self, folder: Path) -> None:
        """From now on, before a rename replaces a file, keep a hard link to it in ``folder``
        (outside the work folder): what an undone rename brings back after a power loss."""
        os.makedirs(folder, exist_ok=True)
        self._keep = os.fspath(folder)

    # -- events -----------------------------------------------------------------------------
    def rel(self, path: Any) -> str | None:
        """``path`` relative to the watched folder, or None outside it."""
        try:
            p = os.fsdecode(os.fspath(path))
        except TypeError:
            return None
        full = os.path.realpath(p) if not os.path.islink(p) else \
            os.path.join(os.path.realpath(os.path.dirname(p) or "."), os.path.basename(p))
        if full == self.root:
            return "."
        return full[len(self.root) + 1:] if full.startswith(self.root + os.sep) else None

    def event(self, op: FileOp, path: str, **fields: Any) -> int:
        """Record one mutation; kill here if it is the armed one. Returns the bytes after which
        a torn write must kill (-1: half of its first write; 0: no tear)."""
        with self._lock:
            self.count += 1
            n, step = self.count, self._step()
            if self._matches(op, path):
                self._kill_at = n
            armed = self._kill_at == n
            action = self._mode if armed and (self._mode, op) in ((FileKill.TORN, FileOp.WRITE),
                                                                  (FileKill.FLIP, FileOp.CLOSE)) else None
            if armed and action is None and self._mode == FileKill.POWER:
                fields["killed"] = FileKill.POWER
            elif armed and action is None:
                if self._mode != FileKill.BEFORE:
                    fields["note"] = f"{self._mode} was asked for, but event {n} is a {op}"
                fields["killed"] = FileKill.BEFORE
            elif action == FileKill.TORN:
                fields.update(killed=FileKill.TORN, tear_bytes=self._tear_bytes)
            elif action == FileKill.FLIP:
                fields["flip"] = True
                self._flip_then_kill = step if step is not None else -1
                self._flip_path = path
            elif self._flip_then_kill is not None and (step or 0) > self._flip_then_kill:
                fields.update(killed=FileKill.BEFORE, note="the first file event after the save that "
                              "was corrupted")
                armed = True
            self._emit(op=op, path=path, n=n, at_step=step, **fields)
            if armed and action is None and self._power_off is not None and \
                    self._mode == FileKill.POWER:
                self._power_off()
            if armed and action is None:
                kill_self()
            return (self._tear_bytes or -1) if action == FileKill.TORN else 0

    def flip_if_armed(self, path: str) -> None:
        """After the close the flip was armed at: invert one byte in the middle of the file, as
        a disk or a copy would; the rank goes on and dies at its next save (``event``)."""
        with self._lock:
            if self._flip_path != path or self._flipped:
                return
            self._flipped = True
        full = os.path.join(self.root, path)
        self._local.busy = True
        try:
            fd = os.open(full, os.O_RDWR)
            try:
                at = os.fstat(fd).st_size // 2
                byte = os.pread(fd, 1, at)
                os.pwrite(fd, bytes([byte[0] ^ 0xFF]) if byte else b"\xff", at)
            finally:
                os.close(fd)
        finally:
            self._local.busy = False
        self._emit(op=FileOp.FLIP, path=path, offset=at, at_step=self._step())

    def read(self, path: str) -> None:
        self._emit(op=FileOp.READ, path=path, at_step=self._step())

    # -- the hooks --------------------------------------------------------------------------
    def _hook(self) -> None:
        sys.addaudithook(self._audit)
        builtins.open = io.open = self._open
        for name in ("fsync", "fdatasync"):
            if hasattr(os, name):
                setattr(os, name, self._sync(getattr(os, name)))
        _after_import("torch", _patch_torch)
        _after_import("safetensors.torch", _patch_safetensors)

    def _audit(self, event: str, args: tuple) -> None:
        entry = _AUDITED.get(event)
        if entry is None or getattr(self._local, "busy", False):
            return
        op, paths = entry
        if op == FileOp.OPEN:
            path, mode, flags = args
            if isinstance(path, int):
                return
            writing = any(c in mode for c in "wax+") if isinstance(mode, str) else \
                bool((flags or 0) & _WRITE_FLAGS)
            rel = self.rel(path)
            if rel is not None:   # not through our open(): its writes and close are not seen
                self.event(FileOp.OPEN, rel, raw=True) if writing else self.read(rel)
            return
        if op == FileOp.TRUNCATE and isinstance(args[0], int):
            return
        rels = [self.rel(a) if isinstance(a, (str, bytes, os.PathLike)) else None
                for a in args[:paths]]
        if op in (FileOp.SYMLINK, FileOp.LINK):   # the link is made at the second path
            if rels[1] is not None:
                self.event(op, rels[1], target=os.fsdecode(os.fspath(args[0])))
        elif any(r is not None for r in rels):
            extra: dict[str, Any] = {"dst": rels[1] if rels[1] is not None else OUTSIDE} \
                if paths == 2 else {}
            if op == FileOp.RENAME and rels[1] is not None:
                extra.update(self._keep_replaced(args[1]))
            self.event(op, rels[0] if rels[0] is not None else OUTSIDE, **extra)

    def _keep_replaced(self, dst: Any) -> dict[str, str]:
        """A hard link to the file a rename is about to replace (``keep_replaced``)."""
        if self._keep is None:
            return {}
        try:
            target = os.fsdecode(os.fspath(dst))
            if not os.path.isfile(target) or os.path.islink(target):
                return {}
            name = f"{os.getpid()}-{self.count + 1}"
            self._local.busy = True
            os.link(target, os.path.join(self._keep, name))
        except (OSError, TypeError):
            return {}
        finally:
            self._local.busy = False
        return {"kept": name}

    @staticmethod
    def _existing(file: Any, mode: str) -> dict[str, Any]:
        """What an open for writing finds: the size of a file already there, and whether the
        open keeps its bytes (``append``: "a" or "r+")."""
        try:
            size = os.stat(file).st_size
        except (OSError, TypeError, ValueError):
            return {}
        return {"existed": size, **({"append": True} if "w" not in mode else {})}

    def _open(self, file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        rel = None if isinstance(file, int) or not any(c in mode for c in "wax+") else self.rel(file)
        if rel is None:
            return _ORIGINAL_OPEN(file, mode, *args, **kwargs)
        self.event(FileOp.OPEN, rel, **self._existing(file, mode))
        self._local.busy = True
        try:
            real = _ORIGINAL_OPEN(file, mode, *args, **kwargs)
        finally:
            self._local.busy = False
        return _WatchedFile(self, real, rel, sequential="w" in mode or "x" in mode)

    def _sync(self, original: Callable[[int], None]) -> Callable[[int], None]:
        def sync(fd: Any) -> None:
            number = fd if isinstance(fd, int) else fd.fileno()
            watched = self._fds.get(number)
            if watched is not None:
                watched._flush_pending()
                self.event(FileOp.FSYNC, watched.rel, written=watched._written,
                           size=os.fstat(number).st_size)
            else:
                self._sync_other(number)
            return original(fd)

        sync.__wrapped__ = original  # type: ignore[attr-defined]
        return sync

    def _sync_other(self, fd: int) -> None:
        """An fsync of a descriptor the proxy did not open (a folder's, ``os.open``'s)."""
        try:
            rel = self.rel(os.readlink(f"/proc/self/fd/{fd}"))
            st = os.fstat(fd)
        except OSError:
            return
        if rel is not None:
            self.event(FileOp.FSYNC, rel, **({"folder": True} if stat.S_ISDIR(st.st_mode)
                                             else {"size": st.st_size}))

    def native_write(self, path: Any, write: Callable[[], Any]) -> Any:
        """A native writer's file: its open, write and close, around ``write()``."""
        rel = self.rel(path)
        if rel is None:
            return write()
        self.event(FileOp.OPEN, rel, **self._existing(path, "w"))
        with self._lock:
            next_is_armed = self._kill_at == self.count + 1 or self._matches(FileOp.WRITE, rel)
        if next_is_armed:   # end state of a kill after the open, before (or mid-way in) the write
            p = os.fspath(path)
            self._local.busy = True
            try:
                _ORIGINAL_OPEN(p, "wb").close()
                if self._mode == FileKill.TORN:
                    write()
                    size = os.path.getsize(p)
                    self._tear_bytes = min(self._tear_bytes or max(1, size // 2), size)
                    os.truncate(p, self._tear_bytes)
            finally:
                self._local.busy = False
            self.event(FileOp.WRITE, rel, offset=0)
            kill_self()  # pragma: no cover - torn: event() did not kill, the tear is done
        self.event(FileOp.WRITE, rel, offset=0)
        self._local.busy = True
        try:
            out = write()
            size, crc = file_crc(os.fspath(path))
        finally:
            self._local.busy = False
        self.event(FileOp.CLOSE, rel, size=size, crc=crc, written=size)
        self.flip_if_armed(rel)
        return out


class _WatchedFile:
    """A file opened for writing under the watched folder: the real file object, reporting."""

    def __init__(self, watcher: Watcher, real: Any, rel: str, *, sequential: bool) -> None:
        self._w, self._real, self.rel = watcher, real, rel
        self._pending = False      # a write event is open (written since open or fsync)
        self._tear_at = 0          # kill once this many bytes of the file are written
        self._written = 0
        self._crc = 0 if sequential else None  # CRC of what was written, while it is the file
        try:
            self._fd: int | None = real.fileno()
            watcher._fds[self._fd] = self
        except (OSError, ValueError, io.UnsupportedOperation):
            self._fd = None

    def write(self, data: Any) -> int:
        if not self._pending:
            self._pending = True
            self._tear_at = self._w.event(FileOp.WRITE, self.rel, offset=self._written)
        if self._tear_at < 0:      # no length asked for: half of this write
            self._tear_at = self._written + max(1, len(data) // 2)
        if self._tear_at and self._written + len(data) >= self._tear_at:
            head = data[:max(0, self._tear_at - self._written)]
            self._real.write(head)
            self._real.flush()
            kill_self()
        if self._crc is not None:
            self._crc = zlib.crc32(data if isinstance(data, (bytes, bytearray, memoryview))
                                   else str(data).encode(getattr(self._real, "encoding", None) or "utf-8"),
                                   self._crc)
        self._written += len(data)
        return self._real.write(data)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def seek(self, *args: Any) -> int:
        self._crc = None
        return self._real.seek(*args)

    def truncate(self, *args: Any) -> int:
        self._crc = None
        return self._real.truncate(*args)

    def _flush_pending(self) -> None:
        self._pending = False

    def close(self) -> None:
        if self._real.closed:
            return
        self._real.flush()
        if self._tear_at:          # the file ended before the torn length: it is all written
            kill_self()
        self._w.event(FileOp.CLOSE, self.rel, written=self._written, **self._summary())
        if self._fd is not None:
            self._w._fds.pop(self._fd, None)
        self._real.close()
        self._w.flip_if_armed(self.rel)

    def _summary(self) -> dict[str, int]:
        try:
            size = os.fstat(self._fd).st_size if self._fd is not None else self._written
        except OSError:
            size = self._written
        if self._crc is not None and size == self._written:
            return {"size": size, "crc": self._crc}
        self._w._local.busy = True
        try:
            size, crc = file_crc(os.path.join(self._w.root, self.rel))
        finally:
            self._w._local.busy = False
        return {"size": size, "crc": crc}

    def __enter__(self) -> "_WatchedFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __iter__(self) -> Any:
        return iter(self._real)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def kill_self() -> None:
    """What a crash leaves: no cleanup, no flush of anything not yet written."""
    os.kill(os.getpid(), signal.SIGKILL)


def file_crc(path: str) -> tuple[int, int]:
    """(size, CRC-32) of a file's bytes."""
    crc, size = 0, 0
    with _ORIGINAL_OPEN(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return size, crc


def snapshot(root: Path) -> dict[str, list[Any]]:
    """What the work folder holds now: ``{relative path: [size, crc]}`` for each file,
    ``[-1, "-> target"]`` for a symlink, ``[-1, "dir"]`` for an empty folder."""
    out: dict[str, list[Any]] = {}
    root = Path(root)
    if not root.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if os.path.islink(full):
                out[rel] = [-1, "-> " + os.readlink(full)]
            elif name in filenames:
                try:
                    out[rel] = list(file_crc(full))
                except OSError:
                    pass
            elif not os.listdir(full):
                out[rel] = [-1, "dir"]
    return out


# -- native writers ----------------------------------------------------------------------------
def _patch_torch(torch: Any) -> None:
    original = torch.serialization.save

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        watcher = _WATCHER
        if watcher is None or not isinstance(f, (str, bytes, os.PathLike)):
            return original(obj, f, *args, **kwargs)
        return watcher.native_write(f, lambda: original(obj, f, *args, **kwargs))

    save.__wrapped__ = original  # type: ignore[attr-defined]
    _rebind(original, save)


def _patch_safetensors(module: Any) -> None:
    original = module.save_file

    atomic = _version(getattr(module, "__version__", None) or _package_version("safetensors")) >= (0, 8)

    def save_file(tensors: Any, filename: Any, *args: Any, **kwargs: Any) -> Any:
        watcher = _WATCHER
        if watcher is None:
            return original(tensors, filename, *args, **kwargs)
        rel = watcher.rel(filename)
        if not atomic or rel is None:
            return watcher.native_write(filename, lambda: original(tensors, filename, *args, **kwargs))
        # the real writer's own steps: a temporary beside the file, then a rename into place
        tmp = os.path.join(os.path.dirname(os.fspath(filename)), _temporary_name(rel))
        out = watcher.native_write(tmp, lambda: original(tensors, tmp, *args, **kwargs))
        os.rename(tmp, filename)
        return out

    save_file.__wrapped__ = original  # type: ignore[attr-defined]
    _rebind(original, save_file)


def _temporary_name(path: str) -> str:
    """``.tmp`` and six letters, as the ``tempfile`` crate names them; drawn from the file's path
    in the work folder, so every run of a save makes the same events."""
    digest = zlib.crc32(path.encode()).to_bytes(4, "big") + zlib.adler32(path.encode()).to_bytes(4, "big")
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    return ".tmp" + "".join(letters[b % len(letters)] for b in digest[:6])


def _package_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(name)
    except PackageNotFoundError:
        return "0"


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for part in text.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def _rebind(original: Any, wrapper: Any) -> None:
    """Point every imported module's name for ``original`` at ``wrapper``: a framework imported
    before the probe attached holds its own reference (``from safetensors.torch import save_file
    as safe_save_file`` in transformers)."""
    for module in list(sys.modules.values()):
        names = getattr(module, "__dict__", None)
        if not isinstance(names, dict):
            continue
        for name, value in list(names.items()):
            if value is original:
                names[name] = wrapper


def _after_import(name: str, patch: Callable[[Any], None]) -> None:
    """Run ``patch(module)`` now if ``name`` is imported, else right after its import."""
    if name in sys.modules:
        patch(sys.modules[name])
        return
    import importlib.abc
    import importlib.machinery

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is None or spec.loader is None:
                return spec
            run = spec.loader.exec_module

            def exec_module(module: Any) -> None:
                run(module)
                patch(module)

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, Finder())
