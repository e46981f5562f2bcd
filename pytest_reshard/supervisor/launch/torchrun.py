"""``torchrun``: each generation is one ``torchrun`` (elastic agent, c10d rendezvous on loopback).

``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` works around pytorch#135712 (restarts on one node fail
with "Gloo connectFullMesh failed" without it).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Callable, Sequence

from pytest_reshard.contract import Cause, Env
from pytest_reshard.supervisor.launch import (KILL_WAIT_S, LiveGeneration, LaunchContext, RankSpec,
                                              free_port, module_or_script, wait_until)
from pytest_reshard.supervisor.launch.forkserver import die_with_parent
from pytest_reshard.procfs import killpg, running


class TorchrunGeneration(LiveGeneration):
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
            if pid is not None and running(pid):
                codes[rank] = None
            elif pid is None and not agent_done:
                codes[rank] = None  # not started yet
            else:
                codes[rank] = 0 if self._clean_exit(rank) else -signal.SIGKILL
        return codes

    def signal(self, rank: int, sig: int) -> None:
        pid = self._pid_of().get(rank)
        if pid is not None:
            killpg(pid, sig)

    def kill(self) -> None:
        killpg(self._agent.pid)
        for pid in self._pid_of().values():
            killpg(pid)
        self._agent.wait(timeout=KILL_WAIT_S)
        wait_until(lambda: not any(running(p) for p in self._pid_of().values()),
                   KILL_WAIT_S, "a torchrun worker")


class TorchrunLauncher:
    name = "torchrun"
    own_rendezvous = True
    references_on = None
    keeps_processes = False
    multi_node = False
    restarts_groups = False
    delivers: frozenset[Cause] = frozenset()

    def __init__(self, pid_of: Callable[[int], dict[int, int]],
                 clean_exit: Callable[[int, int], bool]) -> None:
        # pid_of(gen) / clean_exit(gen, rank) read the probe's events (the supervisor's tail).
        self._pid_of = pid_of
        self._clean_exit = clean_exit

    @classmethod
    def from_context(cls, ctx: LaunchContext) -> "TorchrunLauncher":
        return cls(ctx.pid_of, ctx.clean_exit)

    def launch(self, specs: Sequence[RankSpec]) -> LiveGeneration:
        first = specs[0]
        env = {k: v for k, v in first.env.items()
               if k not in ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "MASTER_PORT")}
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        gen = int(env[Env.GENERATION])
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
               f"--nproc-per-node={len(specs)}", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--max-restarts=0",
               "--monitor-interval=0.1", *module_or_script(first.argv)]
        parent = os.getpid()
        with open(first.log.with_name(f"g{gen}-torchrun.log"), "ab") as log:
            agent = subprocess.Popen(cmd, env=env, cwd=first.cwd, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=lambda: die_with_parent(parent))
        return TorchrunGeneration(agent, lambda: self._pid_of(gen),
                                  lambda rank: self._clean_exit(gen, rank), len(specs))

    def close(self) -> None:
        pass
