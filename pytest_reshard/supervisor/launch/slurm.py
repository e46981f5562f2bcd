"""``slurm``: each generation is one ``srun`` job step of an allocation, one torchrun agent per node.

Inside ``salloc``/``sbatch`` (``SLURM_JOB_ID`` set) the launcher uses that allocation and only
ever cancels the steps it started; elsewhere it takes ``nodes`` nodes itself (an ``salloc`` that
holds them while the harness lives, with a time limit as the last resort) and gives them back at
the end. A generation is ``srun -N k`` on the fewest usable nodes that hold its ranks (at
most the first generation's ranks per node, the same number on each), each task the node agent
below, which runs torch's own agent (``torch.distributed.run.main``: c10d rendezvous on a store
the harness hosts, ``--max-restarts=0``): a new world size is a new step on more or fewer nodes.

The ranks run on other machines, so nothing here reads this machine's ``/proc`` or file times:
the ranks report over the harness's hub (``supervisor/hub.py``), and each node's agent reports
what its own kernel sees of its ranks (state, peak memory, and exit codes: the agent is torch's
agent, the ranks' parent, and reads each exit with ``waitid(WNOWAIT)`` before torch reaps it).

Faults map to what SLURM does:

- ``kill_node``: the rank kills its node's agent and every rank on it (SIGKILL); that node is
  lost for the rest of the run, and the next step runs on the nodes left;
- ``preempt``: SLURM's own signal path: ``scancel --signal=TERM`` of the step (slurmstepd
  signals every process of the step on every node), then ``scancel --signal=KILL`` after the
  cluster's ``KillWait``: the grace SLURM gives, whatever the fault's ``grace_s``;
- ``shift_shards``/``drain`` to fewer ranks: ``scontrol update NodeName=... State=DRAIN`` of the
  nodes the next step no longer needs (``State=RESUME`` again when the launcher closes); a step
  runs only on nodes that are not drained or down;
- a hung rank is killed alone through its node's agent; the end of a generation is ``scancel
  --signal=KILL`` of its step, and the step is gone from ``squeue`` when ``kill`` returns.

``python -m pytest_reshard.supervisor.launch.slurm agent --hub H:P --gen G -- TORCHRUN_ARGS`` is
the per-node entry point.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

from pytest_reshard.contract import HUB_PROTOCOL, Cause, Env, Ev, RunDir, hub_hello, hub_secret
from pytest_reshard.schedule import kinds
from pytest_reshard import procfs
from pytest_reshard.supervisor.launch import (KILL_WAIT_S, host_store, LaunchContext, LiveGeneration, RankSpec,
                                              module_or_script, wait_until)
from pytest_reshard.supervisor.launch.elastic import _UNSET_FOR_AGENTS
from pytest_reshard.supervisor.launch.forkserver import die_with_parent

__all__ = ["SlurmLauncher", "SlurmGeneration", "slurm_unavailable"]

#: c10d rendezvous settings: every agent of a step joins at once (``--nnodes=k``), nobody waits
#: past 60 s; the harness hosts the store, so no node's loss takes it down.
RDZV_CONF = "is_host=false,join_timeout=60,last_call_timeout=1,close_timeout=10"
#: How long a node agent waits for the hub's challenge (the hub's own deadline is shorter).
HELLO_S = 30.0
#: How often a node agent reports its ranks (its own heartbeat, too).
REPORT_S = 0.02
#: States in which a node takes no new step (``scontrol show node``'s State, before any ``+``).
_UNUSABLE = ("DRAIN", "DOWN", "FAIL", "MAINT", "REBOOT", "POWER", "UNKNOWN")
#: The Reason of a drain this launcher made, ``pytest-reshard:job<J>:...`` (swept once J is gone).
_REASON = "pytest-reshard:job"
#: A rank gone (its connection closed) whose code its agent has not reported yet: wait this long.
_CODE_WAIT_S = 1.0  # the code came at most 0.08 s after the close (92 exits, test_slurm.py, load 7-12): 12x


def slurm_unavailable() -> str | None:
    """Why this machine cannot reach a SLURM cluster, or None."""
    missing = [c for c in ("srun", "salloc", "scancel", "scontrol", "squeue", "sinfo")
               if not shutil.which(c)]
    if missing:
        return f"no SLURM client commands on PATH ({', '.join(missing)} missing)"
    done = _slurm("scontrol", "ping", check=False)
    if done.returncode != 0 or "UP" not in done.stdout:
        return f"no SLURM controller answers `scontrol ping`: {(done.stdout + done.stderr).strip()}"
    return None


def _slurm(*cmd: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({done.returncode}): "
                           f"{(done.stderr or done.stdout).strip()}")
    return done


class Allocation:
    """The nodes generations run on: the caller's allocation, or one taken (and given back) here."""

    def __init__(self, nodes: int, *, minutes: int, note: Callable[[str, dict[str, Any]], None]):
        self.own = "SLURM_JOB_ID" not in os.environ
        self.job = ""
        self.drained: set[str] = set()   # nodes this launcher drained (resumed at release)
        self.lost: set[str] = set()      # nodes whose step tasks died (kill_node)
        try:
            self._take(nodes, minutes, note)
        except BaseException:
            self.release()  # an allocation we took is given back, whatever failed after salloc
            raise

    def _take(self, nodes: int, minutes: int, note: Callable[[str, dict[str, Any]], None]) -> None:
        _resume_stale_drains()
        if self.own:
            self.job = self._salloc(nodes, minutes)
        else:
            self.job = os.environ["SLURM_JOB_ID"]
        self.node_list = _field(_slurm("scontrol", "show", "job", "-o", self.job).stdout,
                                "NodeList")
        self.nodes = _slurm("scontrol", "show", "hostnames", self.node_list).stdout.split()
        if len(self.nodes) < nodes:
            raise ValueError(f"the allocation {self.job} has {len(self.nodes)} nodes "
                             f"({' '.join(self.nodes)}), the scenario asks for nodes={nodes}")
        config = _slurm("scontrol", "show", "config").stdout
        #: The grace SLURM gives between a step's SIGTERM and its SIGKILL.
        found = re.search(r"KillWait\s*=\s*(\d+)", config)
        if not found:
            raise RuntimeError(f"no KillWait in `scontrol show config`: {config[:300]}")
        self.kill_wait_s = float(found.group(1))
        note(Ev.NODES, {"launcher": "slurm", "job": self.job, "own_allocation": self.own,
                       "nodes": self.nodes, "kill_wait_s": self.kill_wait_s})

    def _salloc(self, nodes: int, minutes: int) -> str:
        """Our allocation's job id. ``salloc`` holds it for as long as its command runs, and the
        command reads a pipe only this process writes: when the harness ends, however it ends,
        salloc gives the nodes back at once (the time limit is the last resort)."""
        import tempfile

        self._said = tempfile.TemporaryFile("w+")
        # no PR_SET_PDEATHSIG here: a SIGKILLed salloc could not give the allocation back
        self._holder = subprocess.Popen(
            ["salloc", f"--nodes={nodes}", "--job-name=pytest-reshard", f"--time={minutes}",
             "--immediate=120", sys.executable, "-c", "import sys; sys.stdin.read()"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=self._said,
            start_new_session=True)
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            self._said.seek(0)
            said = self._said.read()
            found = re.search(r"Granted job allocation (\d+)", said)
            if found:
                return found.group(1)
            if self._holder.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"salloc gave no allocation: {said.strip() or 'nothing in 150 s'}")

    def usable(self) -> list[str]:
        """Nodes of the allocation a new step may use: not lost, not drained or down."""
        states = {_field(line, "NodeName"): _field(line, "State") for line in
                  _slurm("scontrol", "show", "node", "-o", self.node_list).stdout.splitlines()
                  if line.strip()}  # one call for the whole allocation, however many nodes
        return [node for node in self.nodes if node not in self.lost and
                not any(s in states.get(node, "UNKNOWN") for s in _UNUSABLE)]

    def drain(self, nodes: Sequence[str], what: str) -> None:
        """``State=DRAIN``, with a Reason that names our job: a drain that outlives a killed
        harness is resumed by the next launcher once that job is gone."""
        for node in nodes:
            self.drained.add(node)
            _slurm("scontrol", "update", f"NodeName={node}", "State=DRAIN",
                   f"Reason={_REASON}{self.job}:{what}")

    def steps(self, name: str) -> list[str]:
        """This allocation's steps called ``name`` (``job.step`` ids)."""
        out = _slurm("squeue", "--steps", "--noheader", f"--jobs={self.job}", "--format=%i %j",
                     check=False).stdout
        return [line.split()[0] for line in out.splitlines() if line.split()[1:] == [name]]

    def release(self) -> None:
        """Resume what we drained (if the drain is still ours, not an admin's since); cancel our
        allocation and wait (bounded) until it is gone."""
        for node in sorted(self.drained):
            if _reason(node).startswith(f"{_REASON}{self.job}:"):
                _slurm("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
        self.drained.clear()
        holder = getattr(self, "_holder", None)
        if holder is not None:
            holder.stdin.close()  # its command ends, and salloc gives the allocation back
            try:
                holder.wait(timeout=30)
            except subprocess.TimeoutExpired:
                procfs.killpg(holder.pid)
                holder.wait(timeout=KILL_WAIT_S)
            self._said.close()
        if self.own and self.job:
            _slurm("scancel", self.job, check=False)
            wait_until(lambda: not _slurm("squeue", "--noheader", f"--jobs={self.job}",
                                          check=False).stdout.strip(), 30.0,
                       f"SLURM job {self.job}", poll=0.1)


def _reason(node: str) -> str:
    found = re.search(r"\bReason=(.*?)(?: \w+=|$)", _slurm("scontrol", "show", "node", "-o", node,
                                                           check=False).stdout)
    return found.group(1) if found else ""


def _resume_stale_drains() -> None:
    """Resume the nodes a launcher drained for a job that is gone (a harness killed mid-run)."""
    out = _slurm("sinfo", "--noheader", "--list-reasons", "--format=%N|%E", check=False).stdout
    for line in out.splitlines():
        nodes, _, reason = line.partition("|")
        found = re.match(rf"{_REASON}(\d+):", reason.strip())
        if found and not _slurm("squeue", "--noheader", f"--jobs={found.group(1)}",
                                check=False).stdout.strip():
            for node in _slurm("scontrol", "show", "hostnames", nodes).stdout.split():
                _slurm("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)


def _field(line: str, name: str) -> str:
    found = re.search(rf"\b{name}=(\S+)", line)
    if not found:
        raise RuntimeError(f"no {name}= in SLURM's answer: {line.strip()[:300]}")
    return found.group(1)


def head_address(first_node: str) -> str:
    """The address the nodes reach this machine at: ``RESHARD_SLURM_HEAD``, else the local end
    of the route to the first node (no packet is sent)."""
    if os.environ.get("RESHARD_SLURM_HEAD"):
        return os.environ["RESHARD_SLURM_HEAD"]
    addr = _field(_slurm("scontrol", "show", "node", "-o", first_node).stdout, "NodeAddr")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((addr, 9))
        local = s.getsockname()[0]
    if local.startswith("127."):
        raise RuntimeError(f"the first node, {first_node}, resolves to {addr}, a loopback address "
                           "of this machine: other nodes could not reach a hub there. Set "
                           "RESHARD_SLURM_HEAD to this machine's address on the nodes' network")
    return local


class SlurmLauncher:
    """Generations as job steps of one allocation of ``nodes`` nodes."""

    name = "slurm"
    own_rendezvous = True
    references_on = "fork"  # a clean run needs no cluster
    keeps_processes = False
    multi_node = True
    restarts_groups = False
    delivers = frozenset({Cause.PREEMPT, Cause.RESHARD})  # SIGTERM; drain the nodes left
    #: What every generation's ``srun`` adds to the launcher's own options.
    srun_options: tuple[str, ...] = ()

    @classmethod
    def from_context(cls, ctx: LaunchContext) -> "SlurmLauncher":
        sc = ctx.scenario
        return cls(sc.nodes if sc else 1, timeout_s=sc.timeout_s if sc else 600.0, note=ctx.note)

    def __init__(self, nodes: int, *, timeout_s: float = 600.0,
                 note: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        if nodes < 1:
            raise ValueError(f"nodes={nodes}: need at least one node")
        why = slurm_unavailable()
        if why is not None:
            raise RuntimeError(f"launcher={self.name!r} needs a SLURM cluster: {why}")
        self.nodes = nodes
        self._note = note or (lambda what, fields: None)
        self._minutes = int(timeout_s // 60) + 5
        self.allocation: Allocation | None = None
        self.per_node: int | None = None
        self._hub: Any = None
        self._hub_seen: Any = None  # the hub's counts at its last record
        self._store: Any = None
        self._tag = uuid.uuid4().hex[:8]  # our steps' names: pytest-reshard-<tag>-g<gen>

    def launch(self, specs: Sequence[RankSpec]) -> SlurmGeneration:
        gen, nodes, _, env = self._prepare(specs)
        name = f"pytest-reshard-{self._tag}-g{gen}"
        agent, rendezvous = self._agent(specs, nodes, name, env)
        srun = self._step(name, nodes, env, agent, specs[0], gen)
        self._note(Ev.NODES, {"launcher": self.name, "gen": gen, "name": name, "nodes": nodes,
                              "world_size": len(specs), "hub": self._hub.address,
                              "rendezvous": rendezvous})
        return SlurmGeneration(self, srun, gen, len(specs), nodes, name)

    def _prepare(self, specs: Sequence[RankSpec]) -> tuple[int, list[str], list[str],
                                                           dict[str, str]]:
        """The allocation and the hub (taken on first use), then this generation's number, the
        nodes it runs on, the allocation's usable nodes, and its agents' environment."""
        from pytest_reshard.supervisor.hub import Hub

        first, world = specs[0], len(specs)
        gen = int(first.env[Env.GENERATION])
        if self.allocation is None:
            self.allocation = Allocation(self.nodes, minutes=self._minutes, note=self._note)
            if world % self.nodes:
                raise ValueError(f"world size {world} does not split into {self.nodes} nodes")
            self.per_node = world // self.nodes
        run_dir = RunDir(Path(first.env[Env.DIR]))
        if self._hub is None or self._hub.dir != run_dir:
            if self._hub is not None:
                self._hub.close()   # first: what it drops until its thread ends is counted too
                self.note_hub()
            head = head_address(self.allocation.nodes[0])
            self._hub = Hub(run_dir, head)
            self._hub_seen = self._hub.counts()
            self._store = host_store(head)
        assert self.per_node is not None
        count = -(-world // self.per_node)  # the fewest nodes that hold it (evenly, for torchrun)
        if world % count:
            raise ValueError(f"world size {world} needs {count} nodes of at most {self.per_node} "
                             f"ranks, but does not split evenly over {count} (torchrun starts "
                             "the same number on every node)")
        usable = self.allocation.usable()
        if len(usable) < count:
            raise RuntimeError(f"generation {gen} needs {count} nodes of {self.per_node} ranks, "
                               f"but only {len(usable)} of the allocation's are usable "
                               f"({', '.join(usable) or 'none'}; lost: "
                               f"{', '.join(sorted(self.allocation.lost)) or 'none'})")
        nodes = usable[:count]
        env = {k: v for k, v in first.env.items() if k not in _UNSET_FOR_AGENTS and
               not (k.startswith("SLURM_") and k != "SLURM_CONF")}
        env.update(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",  # pytorch#135712
                   **{Env.HUB: self._hub.address, Env.SCHEDULER: "slurm",
                      Env.HUB_SECRET: self._hub.secret})  # srun hands it on; never on argv
        if os.environ.get("RESHARD_SLURM_IFNAME"):
            env["GLOO_SOCKET_IFNAME"] = os.environ["RESHARD_SLURM_IFNAME"]
        return gen, nodes, usable, env

    def _step(self, name: str, nodes: Sequence[str], env: dict[str, str], agent: Sequence[str],
              first: RankSpec, gen: int) -> subprocess.Popen:
        """Start job step ``name``: one ``agent`` task on each of ``nodes``, its output (every
        task's, labelled) in generation ``gen``'s SLURM log."""
        assert self.allocation is not None
        cmd = ["srun", f"--jobid={self.allocation.job}", f"--job-name={name}",
               f"--nodes={len(nodes)}", "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}",
               "--kill-on-bad-exit=0", "--label", "--unbuffered", *self.srun_options, *agent]
        parent = os.getpid()
        with open(first.log.with_name(f"g{gen}-slurm.log"), "ab") as log:
            return subprocess.Popen(cmd, env=env, cwd=first.cwd, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=lambda: die_with_parent(parent))

    def _agent(self, specs: Sequence[RankSpec], nodes: list[str], name: str,
               env: dict[str, str]) -> tuple[list[str], str]:
        """The node agent's command line (one task per node), which may add to its ``env``, and
        where the ranks meet: here torch's agent, on a c10d rendezvous the harness hosts."""
        first, count = specs[0], len(nodes)
        endpoint = f"{self._hub.address.rpartition(':')[0]}:{self._store.port}"
        return [sys.executable, "-m", "pytest_reshard.supervisor.launch.slurm", "agent",
                "--hub", self._hub.address, "--gen", first.env[Env.GENERATION], "--",
                f"--nnodes={count}", f"--nproc-per-node={len(specs) // count}",
                "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={name}",
                f"--rdzv-conf={RDZV_CONF}", "--max-restarts=0", "--monitor-interval=0.1",
                *module_or_script(first.argv)], endpoint

    def note_hub(self, gen: int | None = None) -> None:
        """Record what the hub kept out since the last record (``Ev.HUB``), if anything: the
        report names each refused connection's reason and address."""
        if self._hub is None:
            return
        what = self._hub.summary(self._hub_seen)
        self._hub_seen = self._hub.counts()
        if what["refused"] or what["dropped"]:
            self._note(Ev.HUB, {"launcher": "slurm", "hub": self._hub.address,
                                **({"gen": gen} if gen is not None else {}), **what})

    def close(self) -> None:
        if self._hub is not None:
            self._hub.close()
            self.note_hub()
            self._hub = None
        self._store = None
        if self.allocation is not None:
            self.allocation.release()
            self.allocation = None


class SlurmGeneration(LiveGeneration):
    """One job step, seen through the hub: its ranks' connections and its agents' reports."""

    def __init__(self, launcher: SlurmLauncher, srun: subprocess.Popen, gen: int,
                 world_size: int, nodes: list[str], name: str) -> None:
        self._launcher, self._srun = launcher, srun
        self._hub = launcher._hub
        self._alloc: Allocation = launcher.allocation  # type: ignore[assignment]
        self.gen, self.world_size, self.nodes, self.name = gen, world_size, nodes, name
        self._killed = False

    def pids(self) -> dict[int, int]:
        """The ranks' pids on their own nodes (not this machine's processes)."""
        return {r: int(info["pid"]) for r in range(self.world_size)
                if (info := self._hub.rank_of(self.gen, r)) is not None}

    def exit_codes(self) -> dict[int, int | None]:
        """A rank has ended when its connection closed or its agent saw it exit; its code is
        what its agent saw, or SIGKILL when its agent is gone too (its node was killed)."""
        self._hub.check()
        srun_done = self._srun.poll() is not None
        if srun_done and not any(g == self.gen for g, _ in self._hub.nodes):
            raise RuntimeError(f"SLURM step {self.name} ended (srun exit {self._srun.returncode}) "
                               "before any node agent reached the hub at "
                               f"{self._hub.address}: {_tail(self._log())}")
        now = time.time()
        codes: dict[int, int | None] = {}
        for rank in range(self.world_size):
            info = self._hub.rank_of(self.gen, rank) or {}
            view = self._hub.node_of(self.gen, rank)
            ended = self._hub.ended.get((self.gen, rank))
            if info.get("code") is not None:
                codes[rank] = int(info["code"])
            elif ended is None and (self.gen, rank) in self._hub.beats:
                codes[rank] = None  # connected and alive
            elif view is not None and view.gone is None and not srun_done and \
                    (ended is None or now - ended < _CODE_WAIT_S):
                codes[rank] = None  # starting, or its agent's report is on its way
            elif view is None and not srun_done:
                codes[rank] = None  # not started yet
            else:
                codes[rank] = -signal.SIGKILL  # its agent is gone without a word: the node died
        return codes

    def signal(self, rank: int, sig: int) -> None:
        """Through the rank's node agent; an agent that cannot be reached takes its step down."""
        if not self._hub.command(self.gen, rank, signal=int(sig)) and sig == signal.SIGKILL:
            self._cancel("KILL")

    def state(self, rank: int, pid: int | None) -> str | None:
        info = self._hub.rank_of(self.gen, rank)
        return None if info is None or info.get("code") is not None else info.get("state")

    def peak_rss(self, rank: int, pid: int | None) -> int | None:
        info = self._hub.rank_of(self.gen, rank)
        return None if info is None else info.get("peak")

    def last_beat(self, rank: int) -> float | None:
        return self._hub.beats.get((self.gen, rank))

    def deliver(self, fault: dict[str, Any]) -> float | None:
        """What SLURM does for a planned fault: a preemption's SIGTERM to the whole step (then,
        as SLURM does, SIGKILL after KillWait: the returned grace, which the supervisor enforces
        by ending the step), a drain of the nodes a smaller world leaves."""
        cause = kinds.get(fault["kind"]).cause
        if cause not in self._launcher.delivers:
            return None
        if cause is Cause.PREEMPT:
            self._cancel("TERM")
            return self._alloc.kill_wait_s
        size = fault["params"].get("to_world_size")
        per_node = self._launcher.per_node or 1
        if cause is Cause.RESHARD and size is not None and size < self.world_size:
            drained = self.nodes[-(-int(size) // per_node):]
            self._alloc.drain(drained, f"{self.name}:drain-to-{size}")
            self._launcher._note(Ev.NODES, {"launcher": "slurm", "gen": self.gen,
                                           "drained": drained, "fault_id": fault["id"]})
        return None

    def capacity(self) -> int | None:
        """Ranks the next step can have: nodes whose agent vanished without a word are lost."""
        for (gen, _), view in list(self._hub.nodes.items()):
            if gen == self.gen and view.gone is not None and view.bye is None:
                self._alloc.lost.add(view.host)
        return len(self._alloc.usable()) * (self._launcher.per_node or 1)

    def kill(self) -> None:
        """The step is cancelled (SIGKILL on every node) and gone from squeue; srun has exited."""
        if self._killed:
            return
        self._killed = True
        if self._srun.poll() is None:
            self._cancel("KILL")
        try:
            self._srun.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            procfs.killpg(self._srun.pid)
            self._srun.wait(timeout=KILL_WAIT_S)
        wait_until(lambda: not self._alloc.steps(self.name), 30.0, f"SLURM step {self.name}",
                   poll=0.1)
        self._launcher.note_hub(self.gen)
        skew = {f"{g}/{r}": round(o, 4) for (g, r), o in self._hub.offsets.items() if g == self.gen}
        if skew:
            self._launcher._note(Ev.NODES, {"launcher": "slurm", "gen": self.gen,
                                           "clock_offsets_s": skew})

    def _cancel(self, sig: str) -> None:
        steps = self._alloc.steps(self.name)
        if not steps and sig != "KILL":
            raise RuntimeError(f"SLURM step {self.name} is not in squeue: nothing to send "
                               f"SIG{sig} to ({_tail(self._log())})")
        for step in steps:
            _slurm("scancel", f"--signal={sig}", step, check=sig != "KILL")
        if sig != "KILL":  # the end of every step is recorded by gen_end; a signal is news
            self._launcher._note(Ev.NODES, {"launcher": "slurm", "gen": self.gen,
                                           "scancel": sig, "steps": steps})

    def _log(self) -> Path:
        return self._hub.dir.log(self.gen, 0).with_name(f"g{self.gen}-slurm.log")


def _tail(path: Path, lines: int = 8) -> str:
    try:
        text = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return f"no log at {path}"
    return f"{path} ends: " + " | ".join(text[-lines:]) if text else f"{path} is empty"


# -- the node agent --------------------------------------------------------------------------
class _Reporter:
    """Runs beside torch's agent in its process: reports the ranks (its children) to the hub."""

    def __init__(self, hub: str, gen: int) -> None:
        host, _, port = hub.rpartition(":")
        secret = hub_secret(os.environ)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.node = int(os.environ.get("SLURM_NODEID", "0"))
        self.host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        self.lock = threading.Lock()
        self.ranks: dict[int, int] = {}        # pid -> rank
        self.codes: dict[int, int] = {}        # pid -> exit code (negative: a signal)
        self.peaks: dict[int, int] = {}
        try:  # before any other thread uses the socket: ``hub_hello`` is its one reader
            buf = hub_hello(self.sock, {"hello": "node", "protocol": HUB_PROTOCOL, "gen": gen,
                                        "node": self.node, "host": self.host},
                            secret, time.monotonic() + HELLO_S)
        except BaseException:
            self.sock.close()
            raise
        self._buf = bytes(buf)  # commands that came with the challenge (none yet: kept anyway)
        self.sock.settimeout(None)  # blocking, as ``send`` and ``_commands`` expect

    def send(self, obj: dict[str, Any] | None = None) -> None:
        """Send ``obj``, or (None) a report of every rank as the kernel sees it now."""
        with self.lock:
            if obj is None:
                obj = {"ranks": self._ranks()}
            try:
                self.sock.sendall(json.dumps(obj).encode() + b"\n")
            except OSError:
                self.orphaned()

    def order(self) -> dict[str, Any]:
        """Wait for the harness to say what to run on this node (``Hub.order``); the harness gone
        meanwhile ends this agent. Call it before ``report_forever``: it reads the socket too."""
        while True:
            while b"\n" not in self._buf:
                try:
                    chunk = self.sock.recv(1 << 16)
                except OSError:
                    chunk = b""
                if not chunk:
                    self.orphaned()
                self._buf += chunk
            line, self._buf = self._buf.split(b"\n", 1)
            try:
                what = json.loads(line)
            except ValueError:
                continue
            if isinstance(what, dict) and isinstance(what.get("order"), dict):
                return what["order"]

    def bye(self, code: int) -> None:
        """The last report (the last exit codes), then the goodbye with this agent's code."""
        self.send()
        self.send({"bye": code})

    def orphaned(self) -> None:
        """The harness is gone: so is everything it started on this node."""
        for pid in list(self.ranks):
            procfs.killpg(pid)
        os._exit(70)

    def exited(self, pid: int, code: int) -> None:
        """A child's exit code, from whichever reader saw it first."""
        if pid not in self.codes:
            self.codes[pid] = code
            if pid in self.ranks:
                self.send()  # at once: the harness is waiting for this code

    def _ranks(self) -> dict[int, dict[str, Any]]:
        ranks = {}
        for pid, rank in list(self.ranks.items()):
            peak = procfs.peak_rss(pid)
            if peak is not None:
                self.peaks[pid] = max(peak, self.peaks.get(pid, 0))
            ranks[rank] = {"pid": pid, "state": procfs.state(pid), "peak": self.peaks.get(pid),
                           "code": self.codes.get(pid)}
        return ranks

    def report_forever(self, discover: bool = True) -> None:
        """Report every ``REPORT_S``; ``discover``: the ranks are this process's children (torch's
        agent started them), found by their ``RANK``; else whoever started them fills ``ranks``."""
        while True:
            for pid in procfs.children(os.getpid()) if discover else ():
                if pid not in self.ranks:
                    rank = _rank_of(pid)
                    if rank is not None:
                        self.ranks[pid] = rank
            self.send()
            self._commands()
            time.sleep(REPORT_S)

    def _commands(self) -> None:
        try:
            chunk = self.sock.recv(1 << 16, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.orphaned()
        *lines, self._buf = (self._buf + chunk).split(b"\n")
        for line in lines:
            try:
                cmd = json.loads(line)
                pid = next((p for p, r in self.ranks.items() if r == cmd["rank"]), None)
                if pid is not None and "signal" in cmd:
                    procfs.killpg(pid, int(cmd["signal"]))
            except (ValueError, KeyError, TypeError):
                continue  # not a command of ours: the harness logs what it sends

    def watch_exits_forever(self) -> None:
        """Read each child's exit as the kernel reports it (``WNOWAIT``: torch still reaps it);
        ``watch_reaps`` catches the ones torch reaped first."""
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:
                time.sleep(0.01)  # no child yet
                continue
            if info is None:
                continue
            self.exited(info.si_pid, _code(info))
            while _zombie(info.si_pid):  # until torch reaps it, waitid(P_ALL) returns it again
                time.sleep(0.001)

    def watch_reaps(self) -> None:
        """Every exit status Python's ``subprocess`` reaps in this process (torch's agent reaps
        its workers with ``Popen.poll``/``wait``) is reported too: none is lost to a race."""
        reporter, original = self, subprocess.Popen._handle_exitstatus  # type: ignore[attr-defined]

        def handle(popen: subprocess.Popen, *args: Any, **kwargs: Any) -> None:
            original(popen, *args, **kwargs)
            if popen.returncode is not None:
                reporter.exited(popen.pid, popen.returncode)
        subprocess.Popen._handle_exitstatus = handle  # type: ignore[attr-defined]


def _code(info: Any) -> int:
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def _zombie(pid: int) -> bool:
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return False  # reaped


def _rank_of(pid: int) -> int | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in environ:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


def _agent(argv: Sequence[str]) -> int:
    """``agent --hub H:P --gen G -- TORCHRUN_ARGS``: report to the hub, run torch's agent."""
    if len(argv) < 5 or argv[0] != "--hub" or argv[2] != "--gen" or argv[4] != "--":
        raise SystemExit("usage: python -m pytest_reshard.supervisor.launch.slurm agent "
                         "--hub HOST:PORT --gen G -- TORCHRUN_ARGS...")
    reporter = _Reporter(argv[1], int(argv[3]))
    os.environ[Env.NODE] = str(reporter.node)
    reporter.watch_reaps()
    threading.Thread(target=reporter.watch_exits_forever, daemon=True).start()
    threading.Thread(target=reporter.report_forever, daemon=True).start()
    from torch.distributed.run import main

    code = 1
    try:
        main(list(argv[5:]))
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        reporter.bye(code)
    return code


if __name__ == "__main__":
    if sys.argv[1:2] != ["agent"]:
        raise SystemExit("usage: python -m pytest_reshard.supervisor.launch.slurm agent ...")
    sys.exit(_agent(sys.argv[2:]))
