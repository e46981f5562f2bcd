"""Several machines on SLURM: the hub that carries a remote rank's history, and the slurm launcher
against a real cluster (Debian's slurmctld, two slurmd nodes in their own network namespaces).

The hub tests need no cluster: a real rank process reports over TCP to a hub on loopback, with a
run folder it cannot see. The cluster tests run the bundled LM on 2 nodes x 2 ranks.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pytest_reshard import chaos
from pytest_reshard.contract import Env, RunDir, read_jsonl
from pytest_reshard.probe import ORPHAN_EXIT
from pytest_reshard.session import Session, scenario_from
from pytest_reshard.supervisor.hub import Hub

from ..conftest import harness_training, until


def _rank(tmp_path: Path, hub: Hub, body: str) -> subprocess.Popen:
    """A rank process whose RESHARD_DIR does not exist: everything must come over the hub."""
    script = tmp_path / "rank.py"
    script.write_text("import os, sys, time\nfrom pytest_reshard import probe\n"
                      "run = probe.attach()\n" + textwrap.dedent(body))
    env = {**os.environ, Env.DIR: str(tmp_path / "elsewhere" / "run"), Env.HUB: hub.address,
           Env.HUB_SECRET: hub.secret,
           Env.GENERATION: "0", "RANK": "0", "WORLD_SIZE": "1"}
    return subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                            stdin=subprocess.PIPE, text=True)


@pytest.fixture
def hub(tmp_path):
    run = RunDir(tmp_path / "run")
    run.events.mkdir(parents=True)
    run.plan(0).write_text(json.dumps({"seed": 1234, "world_size": 1, "roles": ["trainer"],
                                       "device_map": None, "faults": [], "files": False}))
    h = Hub(run, "127.0.0.1")
    yield h
    h.close()


def test_a_rank_elsewhere_gets_its_plan_and_reports_over_the_hub_and_its_end_is_its_socket(
        tmp_path, hub):
    """The rank forks a child that outlives it (a data-loader worker) and vanishes without a
    word (``os._exit``): the hub still sees its end at once, because a child drops the
    connection; its events are in the run folder on the harness's side, and no heartbeat file
    exists anywhere (the beats are lines on the wire)."""
    rank = _rank(tmp_path, hub, """
        print(run.seed, flush=True)
        for step in range(3):
            with run.step(step) as s:
                s.record(loss=1.0 / (step + 1), samples=[step])
        child = os.fork()
        if child == 0:
            sys.stdin.read()   # lives until the test closes stdin
            os._exit(0)
        time.sleep(20 * probe.HEARTBEAT_S)  # 2 s without an event: only its beats reach the hub
        os._exit(0)
    """)
    try:
        assert rank.stdout.readline().strip() == "1234"  # the plan came over the wire
        until(lambda: (0, 0) in hub.ended, 30, "the hub saw the rank end")
        assert rank.wait(timeout=30) == 0
        events, torn, damaged = read_jsonl(hub.dir.rank_events(0, 0))
        kinds = [e["ev"] for _, e in events]
        assert kinds == ["start"] + ["begin", "record", "end"] * 3 and not torn and not damaged
        # it beat until it ended: last line -> end measured <= 0.11 s (load 2.4-6.2), and a
        # rank whose beats stopped would show the 2 s silence (with 0.3 s this could not fail)
        assert abs(hub.beats[(0, 0)] - hub.ended[(0, 0)]) < 1.0
        assert not list(tmp_path.rglob("*.hb"))
        assert not (tmp_path / "elsewhere").exists()
    finally:
        rank.stdin.close()
        rank.kill()
        rank.wait(timeout=10)


def test_a_rank_whose_harness_is_gone_ends_itself(tmp_path, hub):
    rank = _rank(tmp_path, hub, """
        print("attached", flush=True)
        step = 0
        while True:
            with run.step(step):
                time.sleep(0.01)
            step += 1
    """)
    try:
        assert rank.stdout.readline().strip() == "attached"
        hub.close()
        assert rank.wait(timeout=30) == ORPHAN_EXIT
    finally:
        rank.kill()
        rank.wait(timeout=10)


# -- the LM on a real cluster -----------------------------------------------------------------
def _squeue(*args: str) -> str:
    return subprocess.run(["squeue", "--noheader", *args], capture_output=True, text=True,
                          timeout=30).stdout.strip()


def _node_processes() -> list[str]:
    """Every process in the nodes' namespaces but the slurmd daemons (name and pid)."""
    k = os.environ["RESHARD_SLURM_HEAD"].split(".")[2]
    out = []
    for i in range(1, len(os.environ["RESHARD_SLURM_NODES"].split()) + 1):
        pids = subprocess.run(["ip", "netns", "pids", f"reshard-slurm{k}-n{i}"],
                              capture_output=True, text=True, timeout=30).stdout.split()
        for pid in pids:
            try:
                name = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if name != "slurmd":
                out.append(f"{name}[{pid}] on reshard-n{i}")
    return out


@pytest.fixture
def cluster(slurm_cluster):
    """After the test: no job or step of ours in squeue, no process left on any node, no node
    drained."""
    assert not _squeue(), f"the cluster is busy before the test: {_squeue()}"
    yield slurm_cluster
    deadline = time.monotonic() + 30
    while (_squeue() or _node_processes()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _squeue(), f"jobs left: {_squeue()}"
    assert not _node_processes(), f"processes left on the nodes: {_node_processes()}"
    states = subprocess.run(["sinfo", "--noheader", "--format=%T"], capture_output=True,
                            text=True, timeout=30).stdout.split()
    assert not [s for s in states if "drain" in s], f"a node was left drained: {states}"


def _supervisor(result) -> list[dict]:
    return [json.loads(line) for line in
            (result.run_dir / "events" / "supervisor.jsonl").read_text().splitlines()]


def _steps(result) -> list[dict]:
    return [e for e in _supervisor(result) if e["ev"] == "nodes" and "name" in e]


SLURM = dict(launcher="slurm", nodes=2)


def _servers(result) -> list[str]:
    """The nodes a ``slurm-fork`` run started a fork server on, in order."""
    return [e["server"] for e in _supervisor(result) if e["ev"] == "nodes" and "server" in e]


#: The CI budget: a cold ``slurm`` run of these is nightly; ``slurm-fork`` runs them on every PR
#: (the same ``srun`` and ``scancel``, three times faster), and the cold launcher keeps a remote
#: rank's death there (below).
COLD_NIGHTLY = [pytest.param("slurm", marks=pytest.mark.nightly), "slurm-fork"]


@pytest.mark.parametrize("launcher", COLD_NIGHTLY)
@pytest.mark.reshard(world_size=4, steps=10, timeout=240)
def test_lm_survives_a_killed_node_on_the_node_left(reshard_run, cluster, launcher):
    result = reshard_run("lm", faults=[chaos.kill_node(rank=2, at_step=6)],
                         **{**SLURM, "launcher": launcher})
    result.assert_ok()
    if launcher == "slurm-fork":  # one server per node, the node left's kept for generation 1
        assert sorted(_servers(result)) == sorted(_steps(result)[0]["nodes"])
    assert [g.world_size for g in result.history.generations.values()] == [4, 2]
    steps = _steps(result)
    assert [len(s["nodes"]) for s in steps] == [2, 1]
    lost = set(steps[0]["nodes"]) - set(steps[1]["nodes"])
    assert len(lost) == 1, steps  # the killed rank's node is not used again
    died = [e for e in _supervisor(result) if e["ev"] == "detect"]
    assert [(d["kind"], d["rank"], d["exit_code"]) for d in died] == [("died", 2, -9)]


@pytest.mark.parametrize("launcher", COLD_NIGHTLY)
@pytest.mark.reshard(world_size=4, steps=10, timeout=240)
def test_a_slurm_preemption_is_scancel_term_and_costs_no_committed_step(reshard_run, cluster,
                                                                        launcher):
    """Under ``slurm-fork`` the step's task (the node agent) passes the SIGTERM on to its ranks,
    the server's children: every rank must still see it."""
    result = reshard_run("lm", faults=[chaos.preempt(at_step=6)], **{**SLURM, "launcher": launcher})
    result.assert_ok()
    sup = _supervisor(result)
    assert [e["cause"] for e in sup if e["ev"] == "gen_end"] == ["preempt", "complete"]
    assert [e["scancel"] for e in sup if "scancel" in e] == ["TERM"]
    # SLURM, not the rank, sent SIGTERM: every rank of the step saw it
    got = {e["rank"] for e in result.history.events if e["ev"] == "signal" and e["gen"] == 0}
    assert got == {0, 1, 2, 3}
    assert not [e for e in sup if e["ev"] == "detect"]


@pytest.mark.nightly   # the CI budget: a killed node's run stays in CI
@pytest.mark.reshard(world_size=4, steps=10, timeout=240)
def test_a_drain_from_two_nodes_to_one_runs_the_next_step_on_the_node_left(reshard_run, cluster):
    result = reshard_run("lm", faults=chaos.drain(world_size=4, fraction=0.5, waves=1,
                                                 at_step=6), **SLURM)
    result.assert_ok()
    steps = _steps(result)
    drained = [e["drained"] for e in _supervisor(result) if "drained" in e]
    assert len(drained) == 1 and len(drained[0]) == 1
    assert steps[0]["nodes"] == steps[1]["nodes"] + drained[0]
    # the `cluster` fixture checks that the drained node was resumed at the end


@pytest.mark.nightly   # no_rewind's fail case runs on every PR through the local launchers
@pytest.mark.reshard(world_size=4, steps=10, timeout=240)
def test_a_resume_that_ignores_the_checkpoint_fails_no_rewind_on_slurm(reshard_run, cluster):
    result = reshard_run("lm", args=["--bug", "restart_from_zero"],
                         faults=[chaos.kill_node(rank=2, at_step=6)], **SLURM)
    assert result.verdicts["no_rewind"].status == "fail", result.verdicts["no_rewind"].message
    assert "replayed" in result.verdicts["no_rewind"].message


def _knock(run_dir: Path, times: int, done: list[str]) -> None:
    """As a process of another job would: find the hub's address (here in the run's record, as
    a port scan would), say hello as rank 0 with the right protocol, answer the challenge
    without the secret and write a forged ``end``."""
    from pytest_reshard.contract import HUB_PROTOCOL

    sup, deadline = run_dir / "events" / "supervisor.jsonl", time.monotonic() + 120
    while time.monotonic() < deadline:
        lines = sup.read_text().splitlines() if sup.exists() else []
        hubs = [json.loads(x)["hub"] for x in lines if '"hub"' in x]
        if hubs:
            break
        time.sleep(0.05)
    else:
        done.append("no hub address in the record within 120 s")
        return
    host, port = hubs[0].rsplit(":", 1)
    for _ in range(times):
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(json.dumps({"hello": "rank", "protocol": HUB_PROTOCOL, "gen": 0, "rank": 0,
                                  "pid": 1, "t": time.time()}).encode() + b"\n")
            s.sendall(b'{"mac": "' + b"0" * 64 + b'"}\n' + json.dumps(
                {"ev": "end", "step": 999, "t": time.time(), "gen": 0, "rank": 0}).encode() + b"\n")
            try:
                while s.recv(1 << 16):
                    pass
            except ConnectionResetError:
                pass
    done.append("knocked")


@pytest.mark.nightly  # the CI budget: forged peers beside a real rank run on every PR (test_hub.py)
def test_forged_hellos_during_a_slurm_run_are_refused_named_and_change_nothing(tmp_path, cluster):
    """Three connections of a process without the run's secret, during a real run: the verdict
    names them with the address they came from, and the forged ``end`` is nowhere."""
    import threading

    from pytest_reshard.checkers.liveness import liveness

    sc = scenario_from("lm", world_size=4, steps=8, max_generations=1, timeout_s=180, **SLURM)
    done: list[str] = []
    knocker = threading.Thread(target=_knock, args=(tmp_path / "run", 3, done), daemon=True)
    knocker.start()
    with Session(tmp_path) as session:
        history = session.execute(sc, tmp_path / "run")
    knocker.join(timeout=60)
    assert done == ["knocked"]
    v = liveness(history)
    assert v.status == "pass", v.message
    head = os.environ["RESHARD_SLURM_HEAD"]
    assert f"3 connections refused: bad credentials, from {head}" in v.message, v.message
    assert not [e for e in history.events if e.get("step") == 999]


@pytest.mark.parametrize("fault,kind,code", [
    (chaos.kill, "died", -signal.SIGKILL),
    pytest.param(chaos.crash_silently, "exited_early", 0,  # the code is read on its node
                 marks=pytest.mark.nightly),
    pytest.param(chaos.hang, "stopped", None,    # its node's kernel says T
                 marks=pytest.mark.nightly),         # the CI budget: the kill stays in CI
])
def test_a_remote_rank_is_named_killed_silent_or_stopped_from_its_nodes_report(
        tmp_path, cluster, fault, kind, code):
    sc = scenario_from("lm", world_size=4, steps=8, max_generations=1, timeout_s=180,
                       faults=[fault(rank=1, at_step=3, phase="backward")], **SLURM)
    with Session(tmp_path) as session:
        history = session.execute(sc, tmp_path / "run")
    detected = [e for e in history.events if e["ev"] == "detect"]
    assert [(d["kind"], d["rank"], d["exit_code"]) for d in detected] == [(kind, 1, code)]
    assert detected[0]["expected"] and detected[0]["step"] == 3


@pytest.mark.nightly   # the CI budget: a SLURM preemption runs in CI (scancel_term, above)
@pytest.mark.reshard(world_size=4, steps=20, timeout=240)
def test_a_fast_script_preempted_by_slurm_is_judged_from_where_the_sigterm_landed(
        reshard_run, cluster, toy):
    """SLURM's SIGTERM lands tens of ms after the fault point: in a script of 1 ms steps, steps
    later. A script that stops after the step the signal landed in is correct (this was a false
    "kept training after SIGTERM" before the checker counted from the signal's arrival)."""
    result = reshard_run(toy, faults=[chaos.preempt(at_step=5)], **SLURM)
    result.assert_ok()
    assert [e["kind"] for e in _supervisor(result) if e["ev"] == "deliver"] == ["preempt"]
    landed = [e["t"] for e in result.history.events
              if e["ev"] == "signal" and e["gen"] == 0 and not e.get("armed")]
    fired = [e["t"] for e in result.history.events if e["ev"] == "fault"]
    assert not landed or min(landed) > max(fired)  # SLURM's, after the point (if before the end)


@pytest.mark.parametrize("launcher", COLD_NIGHTLY)  # slurm-fork leaves more to clean up
def test_a_harness_killed_outright_leaves_no_job_and_no_process_on_any_node(tmp_path, cluster,
                                                                           launcher):
    """SIGKILL the harness mid-training: its ranks see the hub's connection close and end, the
    agents kill what is left on their nodes, and salloc, whose command reads a pipe only the
    harness held, gives the allocation back (no waiting for its time limit); under
    ``slurm-fork`` the nodes' fork servers go with it."""
    run = tmp_path / "run"
    harness = harness_training(tmp_path, run, f"'lm', world_size=4, steps=400, "
                               f"launcher={launcher!r}, nodes=2, timeout_s=300", ranks=4)
    try:
        assert _squeue()
    finally:
        harness.kill()
        harness.wait(timeout=30)
    until(lambda: not _squeue() and not _node_processes(), 30,
           "the allocation and every process on the nodes gone")




def test_a_fork_server_that_cannot_start_is_the_harness_failure_named_not_a_ranks_death(
        tmp_path, cluster, toy):
    """Its node's ranks never start: the run ends at once with the server's own words, instead
    of its agents waiting out their deadline and the ranks counted dead (-9) against the
    workload."""
    from pytest_reshard import workloads

    workloads.register(workloads.WorkloadSpec("no_server", script=str(toy),
                                              preload=("pytest_reshard_no_such_module",)))
    try:
        sc = scenario_from("no_server", world_size=4, steps=4, timeout_s=120,
                           launcher="slurm-fork", nodes=2)
        started = time.monotonic()
        with Session(tmp_path) as session, \
                pytest.raises(Exception, match="fork server on reshard-n.*ended") as e:
            session.execute(sc, tmp_path / "run")
    finally:
        workloads.unregister("no_server")
    assert "No module named 'pytest_reshard_no_such_module'" in str(e.value)
    assert time.monotonic() - started < 60  # not the agents' 180 s
