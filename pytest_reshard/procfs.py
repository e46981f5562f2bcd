"""What /proc says about processes: state, parent, children, memory, and the processes a
supervisor started (the "nothing leaks" guarantee). Standard library and the contract only, so
both sides use it: the supervisor about its ranks, a rank (the probe, telemetry) about itself.

A rank is ours if its environment names our supervisor pid (cold and torchrun launches) or if it
is a fork server started by us, or forked from one (forked ranks keep the server's command line).
Linux only (reads /proc); elsewhere the lists are empty and the readings None.
"""
from __future__ import annotations

import os
import signal

from pathlib import Path

from pytest_reshard.contract import Env

#: What the fork server's command line contains (forked ranks keep it).
FORKSERVER_MODULE = b"pytest_reshard.supervisor.launch.forkserver"


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def started_by(supervisor_pid: int) -> list[int]:
    """Live (non-zombie) processes started, directly or not, by the supervisor in that pid."""
    me = str(supervisor_pid).encode()
    marker = Env.SUPERVISOR_PID.encode() + b"=" + me
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == supervisor_pid:
            continue
        cmdline = _read(entry / "cmdline").split(b"\0")
        ours = (FORKSERVER_MODULE in cmdline and me in cmdline) or \
            marker in _read(entry / "environ").split(b"\0")
        if ours and state(int(entry.name)) not in (None, "Z"):
            found.append(int(entry.name))
    return sorted(found)


def _stat(pid: int) -> list[bytes]:
    """The fields of /proc/PID/stat after the command name (state first), [] if it is gone."""
    stat = _read(Path(f"/proc/{pid}/stat"))
    return stat.rsplit(b")", 1)[1].split() if b")" in stat else []


def state(pid: int | None) -> str | None:
    """The kernel's one-letter state (R, S, D, T, t, Z, ...), None if there is no such process."""
    fields = _stat(pid) if pid is not None else []
    return fields[0].decode() if fields else None


def running(pid: int) -> bool:
    """Alive and not a zombie."""
    return state(pid) not in (None, "Z")


def children(pid: int) -> list[int]:
    """The pids whose parent is ``pid``: the kernel's own list of each of its threads'
    children where it keeps one (``CONFIG_PROC_CHILDREN``), else a scan of every process."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        return sorted({int(c) for t in tasks for c in (t / "children").read_bytes().split()})
    except OSError:  # gone (a thread, or it), or no children files: every /proc entry's parent
        return [int(e.name) for e in Path("/proc").iterdir()
                if e.name.isdigit() and parent(int(e.name)) == pid]


def killpg(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal the process group ``pid`` leads (every rank runs in a session of its own, so this
    reaches its data-loader workers too), else the process alone; gone already is fine."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def listening(port: int) -> bool:
    """True if something listens on this TCP port (IPv4 or IPv6)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in _read(Path(table)).decode().splitlines()[1:]:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


def parent(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if len(fields) > 1 else None


def leaked_ranks(supervisor_pid: int) -> list[int]:
    """Our processes other than the session's own warm fork servers (which may stay)."""
    return [p for p in started_by(supervisor_pid)
            if not (parent(p) == supervisor_pid
                    and FORKSERVER_MODULE in _read(Path(f"/proc/{p}/cmdline")))]


def alive(pid: int) -> bool:
    """A process with this pid exists (possibly another user's)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stopped(pid: int | None) -> bool:
    """True if the process is stopped by a signal (SIGSTOP/SIGTSTP) or traced."""
    return state(pid) in ("T", "t")


def peak_rss(pid: int | str) -> int | None:
    """The process's peak resident set size in bytes (VmHWM), or None if it is gone."""
    return status_bytes(pid, "VmHWM")


def memory_sets(pid: int | str) -> dict[str, int]:
    """What of the process's resident memory is its own, from /proc/PID/smaps_rollup, in bytes:
    ``uss`` (pages no other process maps), ``pss`` (each shared page divided among the processes
    that map it) and ``anon`` (anonymous memory: heap, tensors, Python objects). A rank forked
    from a warm server maps the server's preloaded pages too; these tell them apart from its own.
    Empty if the process is gone or the kernel has no rollup."""
    fields: dict[bytes, int] = {}
    for line in _read(Path(f"/proc/{pid}/smaps_rollup")).splitlines()[1:]:
        name, _, rest = line.partition(b":")
        try:
            fields[name] = int(rest.split()[0]) * 1024
        except (IndexError, ValueError):
            continue
    if b"Pss" not in fields:
        return {}
    return {"uss": fields.get(b"Private_Clean", 0) + fields.get(b"Private_Dirty", 0),
            "pss": fields[b"Pss"], "anon": fields.get(b"Anonymous", 0)}


def status_bytes(pid: int | str, field: str) -> int | None:
    """A memory field of /proc/PID/status (``VmHWM``, ``VmRSS``, ...) in bytes; ``pid`` may be
    ``"self"``. None if the process or the field is missing."""
    prefix = field.encode() + b":"
    for line in _read(Path(f"/proc/{pid}/status")).splitlines():
        if line.startswith(prefix):
            try:
                return int(line.split()[1]) * 1024
            except (IndexError, ValueError):
                return None
    return None
