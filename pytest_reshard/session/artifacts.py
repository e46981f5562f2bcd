"""The artifacts folder: one run folder per scenario name, and the lock that keeps two sessions
from writing (deleting) each other's runs."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

__all__ = ["ArtifactsInUse", "OWNER_FILE", "lock_artifacts", "run_dir_of"]


class ArtifactsInUse(RuntimeError):
    """Another session writes to the same artifacts folder; the message says which and what to do."""



#: Each run folder names the scenario that wrote it, so no other one ever reuses (deletes) it.
OWNER_FILE = "name.txt"
#: Characters of a node id that stand for themselves in a folder name, or as "_" ("/", ":", "[",
#: "]") without two node ids of one test file meeting (a hash separates them if they do).
_KEPT = "-_./:[]"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


_LOCKS: dict[Path, list[Any]] = {}  # folder -> [open lock file, holders in this process]


class _Lock:
    """One holder of a folder's lock; the lock is per process (re-entrant within it)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def close(self) -> None:
        held = _LOCKS.get(self.folder)
        if held is not None:
            held[1] -= 1
            if held[1] == 0:
                held[0].close()  # releases the flock
                del _LOCKS[self.folder]


def lock_artifacts(folder: Path) -> _Lock:
    """Hold ``folder`` (created if missing) for this process: another process that asks for it
    gets ``ArtifactsInUse`` naming the holder. Close the returned handle to let go."""
    import fcntl
    import os

    folder = Path(folder).resolve()
    held = _LOCKS.get(folder)
    if held is None:
        folder.mkdir(parents=True, exist_ok=True)
        handle = open(folder / ".reshard-lock", "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise ArtifactsInUse(f"the artifacts folder {folder} is in use by {holder}; wait for "
                                 "it to finish, or give this run its own folder "
                                 "(--reshard-artifacts=OTHER)") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"the pytest-reshard session of pid {os.getpid()}\n")
        handle.flush()
        held = _LOCKS[folder] = [handle, 0]
    held[1] += 1
    return _Lock(folder)


def run_dir_of(artifacts: Path, name: str) -> Path:
    """The folder of the scenario called ``name`` (a test's node id) under ``artifacts``: its
    name made safe for a file system, with a short hash of ``name`` when that lost information
    (``x+y`` and ``x_y``) or the folder belongs to another name, so two tests never share one."""
    safe = _safe(name)
    tagged = f"{safe[:110]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    if len(safe) > 120 or any(not (c.isalnum() or c in _KEPT) for c in name):
        return artifacts / tagged
    owner = artifacts / safe / OWNER_FILE
    if owner.exists() and owner.read_text() != name:
        return artifacts / tagged
    return artifacts / safe
