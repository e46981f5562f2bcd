"""Launchers start one generation of ranks and can signal, poll and kill them.

- ``fork``: ranks forked from a warm, torch-preloaded server (the default: a relaunch costs
  a fork plus process-group setup, not an ``import torch``).
- ``local``: a cold ``python`` per rank, exactly what torchrun would run, without the agent.
- ``torchrun``: the real elastic agent (c10d rendezvous) runs the ranks; the path to several
  nodes. Rank pids are learned from the probe's ``start`` events, since the agent owns them.

Every rank runs in a session of its own, so ``kill`` reaches its whole process group
(data-loader workers included).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence

from pytest_reshard.supervisor.launch.forkserver import ForkServer, die_with_parent

KILL_WAIT_S = 10.0


@dataclass
class RankSpec:
    rank: int
    argv: list[str]  # after the interpreter: ["-m", "module", ...] or ["script.py", ...]
    env: dict[str, str]
    cwd: str
    log: Path


class Generation(Protocol):
    def pids(self) -> dict[int, int]: ...
    def exit_codes(self) -> dict[int, int | None]: ...
    def signal(self, rank: int, sig: int) -> None: ...
    def kill(self) -> None: ...


def free_port() -> int:
    """A loopback port nobody listens on right now, for another process to bind next.

    Under pytest-xdist each worker has its own range (``RESHARD_PORT_RANGE``, set by the plugin,
    see ``workers.py``) below the kernel's ephemeral ports, so between our check and the other
    process's bind no other worker and no port-0 bind can take it. Elsewhere the kernel picks.
    """
    span = os.environ.get("RESHARD_PORT_RANGE")
    if not span:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    from pytest_reshard.parallel import parse_port_range

    lo, hi = parse_port_range(span)
    global _next_port
    for _ in range(hi - lo):
        port = lo + (_next_port % (hi - lo))
        _next_port += 1  # rotate: a port just released may linger in TIME_WAIT
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in RESHARD_PORT_RANGE={span}: every one is in "
                       "use; widen the range or run fewer scenarios at once")


_next_port = 0


def _killpg(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_until(done: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} still alive {timeout:.0f} s after SIGKILL")
        time.sleep(0.01)


class _PopenGeneration:
    def __init__(self, procs: dict[int, subprocess.Popen]) -> None:
        self._procs = procs

    def pids(self) -> dict[int, int]:
        return {r: p.pid for r, p in self._procs.items()}

    def exit_codes(self) -> dict[int, int | None]:
        return {r: p.poll() for r, p in self._procs.items()}

    def signal(self, rank: int, sig: int) -> None:
        _killpg(self._procs[rank].pid, sig)

    def kill(self) -> None:
        for p in self._procs.values():
            _killpg(p.pid)
        for p in self._procs.values():
            p.wait(timeout=KILL_WAIT_S)


class LocalLauncher:
    """A cold interpreter per rank (what torchrun would start, without the agent)."""

    name = "local"

    def launch(self, specs: Sequence[RankSpec]) -> Generation:
        parent = os.getpid()
        procs = {}
        for spec in specs:
            with open(spec.log, "ab") as log:
                procs[spec.rank] = subprocess.Popen(
                    [sys.executable, *spec.argv], env=spec.env, cwd=spec.cwd, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True,
                    preexec_fn=lambda: die_with_parent(parent))
        return _PopenGeneration(procs)

    def close(self) -> None:
        pass


class _ForkGeneration:
    def __init__(self, server: ForkServer, pids: dict[int, int]) -> None:
        self._server = server
        self._pids = pids

    def pids(self) -> dict[int, int]:
        return dict(self._pids)

    def exit_codes(self) -> dict[int, int | None]:
        exits = self._server.poll()
        return {r: exits.get(pid) for r, pid in self._pids.items()}

    def signal(self, rank: int, sig: int) -> None:
        _killpg(self._pids[rank], sig)

    def kill(self) -> None:
        for pid in self._pids.values():
            _killpg(pid)
        _wait_until(lambda: all(c is not None for c in self.exit_codes().values()),
                    KILL_WAIT_S, "a forked rank")


class ForkLauncher:
    """Ranks forked from a warm server that has torch and the workload imported."""

    name = "fork"

    def __init__(self, preload: Sequence[str] = ("pytest_reshard.supervisor.launch.warmup",)) -> None:
        self.preload = tuple(preload)
        self._server: ForkServer | None = None

    def launch(self, specs: Sequence[RankSpec]) -> Generation:
        if self._server is None or not self._server.alive():
            self._server = ForkServer(self.preload)
        pids = {s.rank: self._server.spawn(s.argv, s.env, s.cwd, s.log) for s in specs}
        return _ForkGeneration(self._server, pids)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None


class _TorchrunGeneration:
    def __init__(self, agent: subprocess.Popen, pid_of: Callable[[], dict[int, int]],
                 clean_exit: Callable[[int], bool], world_size: int) -> None:
        self._agent = agent
        self._pid_of = pid_of
        self._clean_exit = clean_exit
        self._world_size = world_size

    def pids(self) -> dict[int, int]:
        return self._pid_of()

    def exit_codes(self) -> dict[int, int | None]:
        """The agent owns the ranks, so their exit codes are not ours to read: a rank that is
        gone reads 0 if its probe recorded a clean exit, else -9 (died)."""
        pids = self._pid_of()
        agent_done = self._agent.poll() is not None
        codes: dict[int, int | None] = {}
        for rank in range(self._world_size):
            pid = pids.get(rank)
            if pid is not None and _running(pid):
                codes[rank] = None
            elif pid is None and not agent_done:
                codes[rank] = None  # not started yet
            else:
                codes[rank] = 0 if self._clean_exit(rank) else -signal.SIGKILL
        return codes

    def signal(self, rank: int, sig: int) -> None:
        pid = self._pid_of().get(rank)
        if pid is not None:
            _killpg(pid, sig)

    def kill(self) -> None:
        _killpg(self._agent.pid)
        for pid in self._pid_of().values():
            _killpg(pid)
        self._agent.wait(timeout=KILL_WAIT_S)
        _wait_until(lambda: not any(_running(p) for p in self._pid_of().values()),
                    KILL_WAIT_S, "a torchrun worker")


def _running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


class TorchrunLauncher:
    """Each generation is one ``torchrun`` (elastic agent, c10d rendezvous on loopback).

    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` works around pytorch#135712 (restarts on one node
    fail with "Gloo connectFullMesh failed" without it).
    """

    name = "torchrun"

    def __init__(self, pid_of: Callable[[int], dict[int, int]],
                 clean_exit: Callable[[int, int], bool]) -> None:
        # pid_of(gen) / clean_exit(gen, rank) read the probe's events (the supervisor's tail).
        self._pid_of = pid_of
        self._clean_exit = clean_exit

    def launch(self, specs: Sequence[RankSpec]) -> Generation:
        first = specs[0]
        env = {k: v for k, v in first.env.items()
               if k not in ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "MASTER_PORT")}
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        gen = int(env["RESHARD_GENERATION"])
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
               f"--nproc-per-node={len(specs)}", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--max-restarts=0",
               "--monitor-interval=0.1", *_module_or_script(first.argv)]
        parent = os.getpid()
        with open(first.log.with_name(f"g{gen}-torchrun.log"), "ab") as log:
            agent = subprocess.Popen(cmd, env=env, cwd=first.cwd, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=lambda: die_with_parent(parent))
        return _TorchrunGeneration(agent, lambda: self._pid_of(gen),
                                   lambda rank: self._clean_exit(gen, rank), len(specs))

    def close(self) -> None:
        pass


def _module_or_script(argv: Sequence[str]) -> list[str]:
    return ["-m", *argv[1:]] if argv[0] == "-m" else list(argv)
