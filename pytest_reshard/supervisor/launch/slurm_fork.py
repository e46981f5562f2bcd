"""``slurm-fork``: the ``slurm`` launcher with a warm fork server on each node, kept across the
generations of one allocation: a relaunch on the same nodes costs a fork, not ``import torch`` in
an agent and in every rank, nor a job step's start.

The first generation that uses a node starts its server there, a job step of its own that
imports torch and the workload once (``forkserver.serve_at``, on an abstract unix socket named
after the launcher and the node). Each generation stays one job step, as under ``slurm``, so
everything SLURM does to a step still happens to it; its task on each node is a small agent (no
torch) that reports to the harness's hub as torch's agent does under ``slurm``. The step is
started one generation early, on every usable node, and its agents wait: when the generation
launches, the hub gives each its order (``Hub.order``: nothing, on a node the generation does not
use), and the agent asks its node's server to fork those ranks with the environment torchrun
would give them (``RANK``, ``LOCAL_RANK``, ``GROUP_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` of a
store the harness hosts for the generation), handing them its own output, so their lines land in
the step's log.

What differs from ``slurm``, and what it does not prove:

- no torch agent and no c10d rendezvous: a job that depends on torchrun's agent (its restarts,
  its error files) runs under ``slurm``;
- the ranks are the server's children, not the step's processes: a preemption's SIGTERM
  reaches the agent, which passes it on to its ranks at once; the SIGKILL after ``KillWait`` (or
  a step's cancel) kills the agent, and the server kills that agent's ranks when its connection
  drops. A step's memory limits and accounting do not cover the ranks;
- ``kill_node`` kills the node's server (the ranks' parent) and its ranks; the agent, left
  without its server, dies too, and the node is lost as under ``slurm``;
- a step started one generation early runs on the nodes usable then: a node drained or lost since
  gets an empty order; a step that does not cover the generation's nodes is cancelled and a new
  one started (a cold step, as at the first generation).

``python -m pytest_reshard.supervisor.launch.slurm_fork agent --hub H:P --gen G --server NAME``
is the per-node entry point.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pytest_reshard import procfs
from pytest_reshard.contract import Env, Ev
from pytest_reshard.supervisor.launch import (KILL_WAIT_S, LaunchContext, RankSpec, host_store,
                                              module_or_script)
from pytest_reshard.supervisor.launch.forkserver import die_with_parent, server_environment
from pytest_reshard.supervisor.launch.slurm import SlurmGeneration, SlurmLauncher, _Reporter, _tail
from pytest_reshard.workloads import WARMUP

__all__ = ["SlurmForkLauncher"]

#: How long an agent waits for its node's server (the first generation's: torch importing).
SERVER_WAIT_S = 180.0


@dataclass
class _Step:
    """A job step of node agents, each waiting for its order (what to run on its node)."""

    gen: int
    name: str
    nodes: list[str]
    env: dict[str, str]     # the agents' environment: a rank's is this plus its order's part
    srun: subprocess.Popen
    hub: Any


class SlurmForkLauncher(SlurmLauncher):
    """Generations as job steps of one allocation, their ranks forked by each node's server."""

    name = "slurm-fork"
    srun_options = ("--overlap",)  # the servers' steps hold the nodes' CPUs too

    @classmethod
    def from_context(cls, ctx: LaunchContext) -> "SlurmForkLauncher":
        sc = ctx.scenario
        return cls(sc.nodes if sc else 1, preload=ctx.preload,
                   timeout_s=sc.timeout_s if sc else 600.0, note=ctx.note)

    def __init__(self, nodes: int, *, preload: Sequence[str] = (WARMUP,), timeout_s: float = 600.0,
                 note: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        super().__init__(nodes, timeout_s=timeout_s, note=note)
        self.preload = tuple(preload)
        self._servers: dict[str, subprocess.Popen] = {}  # node -> its server step's srun
        self._server_logs: dict[str, Path] = {}
        self._server = f"pytest-reshard-{self._tag}"       # the steps' name and the socket's
        self._standby: _Step | None = None                 # the next generation's step, waiting
        self._gen_store: Any = None

    def launch(self, specs: Sequence[RankSpec]) -> SlurmGeneration:
        """The generation's step is the one started, waiting, at the last launch when it covers
        this generation's nodes (else a new one); each node's agent is ordered to run its ranks,
        and the next generation's step is started to wait in turn."""
        gen, nodes, usable, env = self._prepare(specs)
        first, per_node = specs[0], len(specs) // len(nodes)
        self._serve(nodes, env, first)
        step, self._standby = self._standby, None
        if step is None or step.gen != gen or step.hub is not self._hub or \
                not set(nodes) <= set(step.nodes) or step.srun.poll() is not None:
            self._end(step)
            step = self._step_of(gen, nodes, env, first)
        head = self._hub.address.rpartition(":")[0]
        self._gen_store = host_store(head, len(specs))  # a fresh one: keys start at attempt 0
        torchrun = dict(MASTER_ADDR=head, MASTER_PORT=str(self._gen_store.port),
                        TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="0",
                        TORCHELASTIC_MAX_RESTARTS="0", WORLD_SIZE=str(len(specs)),
                        LOCAL_WORLD_SIZE=str(per_node))
        argv = module_or_script(first.argv)
        for node in step.nodes:
            ranks = []
            if node in nodes:  # what torchrun gives a rank that its agent's environment lacks
                group = nodes.index(node)
                for spec in specs[group * per_node:(group + 1) * per_node]:
                    own = {**spec.env, **torchrun, "RANK": str(spec.rank),
                           "ROLE_RANK": str(spec.rank), "LOCAL_RANK": str(spec.rank % per_node),
                           "GROUP_RANK": str(group), Env.NODE: str(group)}
                    ranks.append([spec.rank, {k: v for k, v in own.items()
                                              if step.env.get(k) != v and not
                                              (k.startswith("SLURM_") and k != "SLURM_CONF")}])
            self._hub.order(gen, node, {"argv": argv, "ranks": ranks})
        self._note(Ev.NODES, {"launcher": self.name, "gen": gen, "name": step.name,
                              "nodes": nodes, "world_size": len(specs), "hub": self._hub.address,
                              "rendezvous": f"{head}:{self._gen_store.port}"})
        live = _ForkedGeneration(self, step.srun, gen, len(specs), nodes, step.name)
        self._standby = self._step_of(gen + 1, usable, env, first)
        return live

    def _step_of(self, gen: int, nodes: list[str], env: dict[str, str], first: RankSpec) -> _Step:
        name = f"pytest-reshard-{self._tag}-g{gen}"
        srun = self._step(name, nodes, env, [
            sys.executable, "-m", "pytest_reshard.supervisor.launch.slurm_fork", "agent",
            "--hub", self._hub.address, "--gen", str(gen), "--server", self._server], first, gen)
        return _Step(gen, name, nodes, env, srun, self._hub)

    def _end(self, step: _Step | None) -> None:
        """A waiting step no generation will use: cancelled, and gone when this returns."""
        if step is not None:
            self._cancel(step.name)
            _wait(step.srun)

    def _cancel(self, name: str) -> None:
        """SIGKILL our steps called ``name`` (SLURM ends every process of a step)."""
        for job_step in self.allocation.steps(name) if self.allocation is not None else ():
            subprocess.run(["scancel", "--signal=KILL", job_step], capture_output=True, timeout=30)

    def _serve(self, nodes: Sequence[str], env: dict[str, str], first: RankSpec) -> None:
        """A server on each of ``nodes`` that has none: one job step per node, alive until the
        launcher closes (or its node dies)."""
        assert self.allocation is not None
        parent = os.getpid()
        for node in nodes:
            running = self._servers.get(node)
            if running is not None and running.poll() is None:
                continue
            log = self._server_logs[node] = first.log.with_name(f"slurm-fork-{node}.log")
            with open(log, "ab") as out:
                self._servers[node] = subprocess.Popen(
                    ["srun", f"--jobid={self.allocation.job}", f"--job-name={self._server}",
                     "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--overlap",
                     "--kill-on-bad-exit=0", "--unbuffered", sys.executable, "-m",
                     "pytest_reshard.supervisor.launch.forkserver", "--at",
                     f"{self._server}-{node}", *self.preload],
                    env=server_environment(env), cwd=first.cwd, stdout=out,
                    stderr=subprocess.STDOUT, start_new_session=True,
                    preexec_fn=lambda: die_with_parent(parent))
            self._note(Ev.NODES, {"launcher": self.name, "server": node, "log": str(log)})

    def close(self) -> None:
        """The waiting step and the servers' steps end first (the ranks with them), then the
        allocation."""
        try:
            self._end(self._standby)
            self._standby = None
            self._cancel(self._server)
            for srun in self._servers.values():
                _wait(srun)
            self._servers.clear()
            self._gen_store = None
        finally:
            super().close()


    def check_servers(self, gen: int, nodes: Sequence[str]) -> None:
        """Raise if a node's server ended before any rank of generation ``gen`` started there:
        the harness failed to start the ranks (their deaths would blame the workload). A server
        that ends after (``kill_node`` kills it) is the node's death."""
        for node in nodes:
            srun = self._servers.get(node)
            if srun is None or srun.poll() is None:
                continue
            if not any(g == gen and view.host == node and view.ranks
                       for (g, _), view in list(self._hub.nodes.items())):
                raise RuntimeError(f"the fork server on {node} ended (srun exit "
                                   f"{srun.returncode}) before generation {gen}'s ranks started "
                                   f"there: {_tail(self._server_logs[node])}")


class _ForkedGeneration(SlurmGeneration):
    """A generation whose ranks its nodes' servers fork (``check_servers`` at each poll)."""

    _launcher: SlurmForkLauncher

    def exit_codes(self) -> dict[int, int | None]:
        self._launcher.check_servers(self.gen, self.nodes)
        return super().exit_codes()


def _wait(srun: subprocess.Popen) -> None:
    try:
        srun.wait(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        procfs.killpg(srun.pid)
        srun.wait(timeout=KILL_WAIT_S)


# -- the node agent --------------------------------------------------------------------------
def _connect(name: str, deadline: float) -> socket.socket:
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect("\0" + name)
            return sock
        except OSError as e:
            sock.close()
            if time.monotonic() > deadline:
                raise TimeoutError(f"no fork server {name} on this node after {SERVER_WAIT_S:.0f} "
                                   f"s ({e}): its log is logs/slurm-fork-<node>.log in the "
                                   "run folder") from None
            time.sleep(0.01)


def _agent(argv: Sequence[str]) -> int:
    """``agent --hub H:P --gen G --server NAME``: report to the hub, wait for the harness's
    order, have the node's server fork the ranks it names, pass a SIGTERM on to them, end when
    they have all ended."""
    if len(argv) != 6 or argv[0] != "--hub" or argv[2] != "--gen" or argv[4] != "--server":
        raise SystemExit("usage: python -m pytest_reshard.supervisor.launch.slurm_fork agent "
                         "--hub HOST:PORT --gen G --server NAME")
    reporter = _Reporter(argv[1], int(argv[3]))
    order = reporter.order()
    if not order["ranks"]:  # a waiting step's node this generation does not use
        reporter.bye(0)
        return 0
    try:
        server = _connect(f"{argv[5]}-{reporter.host}", time.monotonic() + SERVER_WAIT_S)
    except TimeoutError as e:
        print(e, file=sys.stderr, flush=True)
        reporter.bye(1)
        return 1
    # the ranks write to this task's output: the step's log, as torch's agent's workers do
    socket.send_fds(server, [b'{"op": "hello"}\n'], [sys.stdout.fileno()])
    server.sendall(b"".join(json.dumps({"op": "spawn", "argv": order["argv"], "cwd": os.getcwd(),
                                        "env": {**os.environ, **own}}).encode() + b"\n"
                            for _, own in order["ranks"]))

    def forward(signum: int, frame: Any) -> None:
        for pid in list(reporter.ranks):
            if pid not in reporter.codes:
                procfs.killpg(pid, signum)
    signal.signal(signal.SIGTERM, forward)
    threading.Thread(target=reporter.report_forever, args=(False,), daemon=True).start()
    ranks = [int(rank) for rank, _ in order["ranks"]]
    started, buffer = 0, b""
    while started < len(ranks) or any(pid not in reporter.codes for pid in reporter.ranks):
        chunk = server.recv(1 << 16)
        if not chunk:  # the node's server died (kill_node): so does this node
            os.kill(os.getpid(), signal.SIGKILL)
        *lines, buffer = (buffer + chunk).split(b"\n")
        for line in lines:
            msg = json.loads(line)
            if "pid" in msg:
                reporter.ranks[int(msg["pid"])] = ranks[started]
                started += 1
            elif "exit" in msg:
                reporter.exited(int(msg["exit"]), int(msg["code"]))
    code = 0 if all(c == 0 for c in reporter.codes.values()) else 1
    reporter.bye(code)
    return code


if __name__ == "__main__":
    if sys.argv[1:2] != ["agent"]:
        raise SystemExit("usage: python -m pytest_reshard.supervisor.launch.slurm_fork agent ...")
    sys.exit(_agent(sys.argv[2:]))
