"""Multi-node runs on torch's own elastic machinery: one torchrun agent per node.

Each node is a ``python -m torch.distributed.run --nnodes=MIN:MAX --rdzv-backend=c10d`` agent,
in a network namespace of its own when the machine allows (``pytest_reshard.supervisor.launch.netns``), else on
loopback. The agents restart their workers after a failure and meet again at the rendezvous with
whoever is left, so losing a node scales the world down from MAX towards MIN nodes without the
harness relaunching anything; the workload then reshards on load, as it would in a cluster.

What the harness adds, and why:

- It hosts the c10d rendezvous store (``is_host=false`` for every agent): a stable endpoint, like
  a head node or etcd in a cluster, so losing any node never takes the rendezvous down.
- Agents start together: each imports torch, checks in at the store and waits (bounded) for the
  others, then runs torch's ``torch.distributed.run.main``. Without that, a fast agent completes a
  one-node round alone and the next one forces a membership restart.
- Generations: the workers of a restart read it from ``TORCHELASTIC_RESTART_COUNT``, which the
  probe adds to the generation the agents were launched in (``RESHARD_ELASTIC=1``). The
  supervisor, told by ``advance``, writes that generation's plan and watches it rather than
  launching one. Torch counts a restart for a failure, not for a node joining, so a scale-up
  (membership change) is not a generation of its own here: these scenarios lose nodes.

``python -m pytest_reshard.supervisor.launch.elastic agent ...`` is the per-node entry point (the barrier, then
torchrun's ``main``).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from pytest_reshard.contract import Cause, Env, Ev
from pytest_reshard.supervisor.outcome import HarnessError
from pytest_reshard.supervisor.launch import (KILL_WAIT_S, host_store, LiveGeneration, LaunchContext, RankSpec,
                                              module_or_script, wait_until)
from pytest_reshard.supervisor.launch.forkserver import die_with_parent
from pytest_reshard.procfs import children, killpg, running

__all__ = ["RDZV_CONF", "ElasticLauncher"]

#: Rendezvous settings for fast, bounded recovery on one machine: a dead node's heartbeat
#: expires after 3 x 1 s, a round closes 1 s after the minimum is there, nobody waits past 60 s.
RDZV_CONF = ("is_host=false,join_timeout=60,last_call_timeout=1,close_timeout=10,"
             "keep_alive_interval=1,keep_alive_max_attempt=3")
BARRIER_TIMEOUT_S = 120.0
_UNSET_FOR_AGENTS = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR",
                     "MASTER_PORT", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID",
                     "TORCHELASTIC_USE_AGENT_STORE", "RESHARD_ROLE")  # per rank: the plan has roles


class ElasticLauncher:
    """``nodes`` torchrun agents of ``world_size / nodes`` workers each, min ``min_nodes``."""

    name = "elastic"
    own_rendezvous = True
    references_on = "fork"  # a clean run needs no agents
    keeps_processes = False
    multi_node = True
    restarts_groups = False
    delivers: frozenset[Cause] = frozenset()

    @classmethod
    def from_context(cls, ctx: LaunchContext) -> "ElasticLauncher":
        sc = ctx.scenario
        return cls(sc.nodes if sc else 1, ctx.pid_of, ctx.clean_exit,
                   min_nodes=sc.min_nodes if sc else 1, network=sc.network if sc else "auto",
                   note=ctx.note)

    def __init__(self, nodes: int, pid_of: Callable[[int], dict[int, int]],
                 clean_exit: Callable[[int, int], bool], *, min_nodes: int = 1,
                 network: str = "auto", max_restarts: int = 3,
                 note: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        if nodes < 1 or not 1 <= min_nodes <= nodes:
            raise ValueError(f"nodes={nodes}, min_nodes={min_nodes}: need 1 <= min_nodes <= nodes")
        self.nodes, self.min_nodes, self.max_restarts = nodes, min_nodes, max_restarts
        self.network_mode = network
        self._pid_of, self._clean_exit = pid_of, clean_exit
        self._note = note or (lambda what, fields: None)
        self.network: Any = None
        self._store: Any = None
        self._launches = 0

    def launch(self, specs: Sequence[RankSpec]) -> ElasticGeneration:
        from pytest_reshard.supervisor.launch import netns

        world = len(specs)
        if world % self.nodes:
            raise ValueError(f"world size {world} does not split into {self.nodes} nodes")
        per_node = world // self.nodes
        if self.network is None:
            self.network = netns.create(self.nodes, self.network_mode)
            self._store = host_store(self.network.head)
            self._note(Ev.NODES, {"mode": self.network.mode, "hosts": self.network.hosts,
                                   "endpoint": f"{self.network.head}:{self._store.port}",
                                   "namespaces": self.network.namespaces,
                                   "note": self.network.note})
        first = specs[0]
        gen = int(first.env[Env.GENERATION])
        self._launches += 1
        run_id = f"{first.env.get('TORCHELASTIC_RUN_ID', 'reshard')}-l{self._launches}"
        endpoint = f"{self.network.head}:{self._store.port}"
        agents = []
        parent = os.getpid()
        for node in range(self.nodes):
            env = {k: v for k, v in first.env.items() if k not in _UNSET_FOR_AGENTS}
            env.update(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",  # pytorch#135712
                       GLOO_SOCKET_IFNAME=self.network.ifname,
                       **{Env.ELASTIC: "1", Env.NODE: str(node)})
            cmd = [sys.executable, "-m", "pytest_reshard.supervisor.launch.elastic", "agent",
                   "--barrier", f"{endpoint}/{run_id}/{self.nodes}", "--",
                   f"--nnodes={self.min_nodes}:{self.nodes}", f"--nproc-per-node={per_node}",
                   "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}",
                   f"--rdzv-conf={RDZV_CONF}", f"--local-addr={self.network.hosts[node]}",
                   f"--max-restarts={self.max_restarts}", "--monitor-interval=0.1",
                   *module_or_script(first.argv)]
            enter = self.network.preexec(node)

            def setup(enter: Callable[[], None] | None = enter) -> None:
                die_with_parent(parent)
                if enter is not None:
                    enter()
            with open(first.log.with_name(f"g{gen}-node{node}.log"), "ab") as log:
                agents.append(subprocess.Popen(cmd, env=env, cwd=first.cwd, stdout=log,
                                               stderr=subprocess.STDOUT, start_new_session=True,
                                               preexec_fn=setup))
        return ElasticGeneration(self, agents, gen, world, per_node)

    def close(self) -> None:
        self._store = None
        if self.network is not None:
            self.network.close()
            self.network = None


class ElasticGeneration(LiveGeneration):
    """The agents of one launch, seen through one generation (one rendezvous round) at a time."""

    def __init__(self, launcher: ElasticLauncher, agents: list[subprocess.Popen], gen: int,
                 world_size: int, per_node: int) -> None:
        self._launcher = launcher
        self._agents = agents
        self.gen, self.world_size, self.per_node = gen, world_size, per_node
        self._seen: set[int] = set()  # every worker pid of every generation of this launch

    # -- the LiveGeneration protocol -------------------------------------------------------------
    def pids(self) -> dict[int, int]:
        pids = self._launcher._pid_of(self.gen)
        self._seen.update(pids.values())
        return pids

    def exit_codes(self) -> dict[int, int | None]:
        """Workers belong to the agents: a gone worker reads 0 if its probe recorded a clean
        exit, else -9; one not started yet is running while any agent is."""
        pids = self.pids()
        agents_alive = any(a.poll() is None for a in self._agents)
        codes: dict[int, int | None] = {}
        for rank in range(self.world_size):
            pid = pids.get(rank)
            if (pid is not None and running(pid)) or (pid is None and agents_alive):
                codes[rank] = None
            else:
                codes[rank] = 0 if self._launcher._clean_exit(self.gen, rank) else -signal.SIGKILL
        return codes

    def signal(self, rank: int, sig: int) -> None:
        pid = self.pids().get(rank)
        if pid is not None:
            killpg(pid, sig)

    def kill(self) -> None:
        """End the whole launch: every agent and every worker it started."""
        self.pids()
        for agent in self._agents:
            self._seen.update(children(agent.pid))
            killpg(agent.pid)
        for pid in self._seen:
            killpg(pid)
        for agent in self._agents:
            agent.wait(timeout=KILL_WAIT_S)
        wait_until(lambda: not any(running(p) for p in self._seen), KILL_WAIT_S,
                    "an elastic worker")

    def fence(self, node: int) -> None:
        """Node ``node``'s agent and its workers, killed: the agents left re-form without it."""
        agent = self._agents[node]
        workers = children(agent.pid)
        self._seen.update(workers)
        for pid in (agent.pid, *workers):
            killpg(pid)
        try:
            agent.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            raise HarnessError(f"node {node}'s agent (pid {agent.pid}) outlived SIGKILL by "
                               f"{KILL_WAIT_S:.0f} s (a process stuck in the kernel: see its "
                               "state in ps): the world it would re-form cannot be "
                               "trusted") from None

    # -- elastic -------------------------------------------------------------------------------
    def restarting(self) -> bool:
        """True while some agent lives: after a failure, it re-forms the world on its own."""
        return any(a.poll() is None for a in self._agents)

    def next_world_size(self) -> int:
        return self.per_node * sum(a.poll() is None for a in self._agents)

    def advance(self, gen: int, world_size: int) -> ElasticGeneration:
        """The same agents, watched through their next rendezvous round (generation ``gen``)."""
        if gen != self.gen + 1:
            raise ValueError(f"elastic generations follow torch's restart count: {self.gen} -> "
                             f"{self.gen + 1}, not {gen}")
        nxt = ElasticGeneration(self._launcher, self._agents, gen, world_size, self.per_node)
        nxt._seen = self._seen
        return nxt


def _agent(argv: Sequence[str]) -> int:
    """``agent --barrier HOST:PORT/KEY/N -- TORCHRUN_ARGS...``: wait for the N agents, then run
    torch's own agent."""
    if len(argv) < 3 or argv[0] != "--barrier" or argv[2] != "--":
        raise SystemExit("usage: python -m pytest_reshard.supervisor.launch.elastic agent --barrier HOST:PORT/KEY/N "
                         "-- TORCHRUN_ARGS...")
    from datetime import timedelta

    from torch.distributed import TCPStore
    from torch.distributed.run import main

    address, key, count = argv[1].split("/")
    host, port = address.rsplit(":", 1)
    store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=60))
    arrived = store.add(f"pytest-reshard/{key}/agents", 1)
    deadline = time.monotonic() + BARRIER_TIMEOUT_S
    while arrived < int(count):
        if time.monotonic() > deadline:
            raise SystemExit(f"only {arrived} of {count} agents arrived within "
                             f"{BARRIER_TIMEOUT_S:.0f} s")
        time.sleep(0.01)
        arrived = store.add(f"pytest-reshard/{key}/agents", 0)
    del store
    main(list(argv[3:]))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["agent"]:
        raise SystemExit("usage: python -m pytest_reshard.supervisor.launch.elastic agent --barrier ... -- ...")
    sys.exit(_agent(sys.argv[2:]))
