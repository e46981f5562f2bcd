"""``partition`` and ``slow_link`` end to end, on namespaced nodes (torchrun agents, each node a
network namespace of its own, its link changed with iptables and tc from inside).

A partition the LM notices within its collective timeout is fenced and the LM resumes on the
node left; one it waits out is a hang that ``liveness`` fails; one shorter than its timeout is
ridden out. A slow link changes no verdict, and ``throughput`` reports the drop. They need root,
iproute2 and iptables: they skip with the reason elsewhere, and fail under
``RESHARD_NETNS_REQUIRED=1``.
"""
from __future__ import annotations

import os
import shutil

import pytest

from pytest_reshard import chaos
from pytest_reshard.contract import NOT_INJECTED, Detected
from pytest_reshard.supervisor.launch import netns


def _missing() -> str | None:
    why = netns.netns_unavailable()
    if why is None:
        tools = [t for t in ("iptables", "tc") if shutil.which(t) is None]
        why = f"{' and '.join(tools)} missing" if tools else None
    return why


MISSING = _missing()


@pytest.fixture(autouse=True)
def _namespaced_nodes() -> None:
    if MISSING is not None:
        if os.environ.get("RESHARD_NETNS_REQUIRED") == "1":
            pytest.fail(f"RESHARD_NETNS_REQUIRED=1 but namespaced nodes cannot be made: {MISSING}")
        pytest.skip(f"namespaced nodes cannot be made here: {MISSING}")


def _lm(reshard_run, fault, *, args=(), **options):
    return reshard_run("lm", world_size=4, steps=12, launcher="elastic", nodes=2,
                       network="netns", args=list(args), faults=[fault], **options)


def _step_times(result, gen: int = 0) -> dict[int, float]:
    """Rank 0's time from each step's end to the next one's, in ``gen``."""
    ends = {e["step"]: e["t"] for e in result.history.events
            if e["ev"] == "end" and e.get("rank") == 0 and e.get("gen") == gen}
    steps = sorted(ends)
    return {b: ends[b] - ends[a] for a, b in zip(steps, steps[1:])}


@pytest.mark.reshard(timeout=240)
def test_a_partitioned_node_is_fenced_and_the_lm_resumes_on_the_node_left(reshard_run):
    result = _lm(reshard_run, chaos.partition(rank=2, at_step=6), args=["--pg-timeout-s", "5"])
    result.assert_ok()
    gens = result.history.generations
    assert [g.world_size for g in gens.values()] == [4, 2]
    (cut,) = [d for d in result.history.detections() if d.kind == Detected.PARTITIONED]
    assert (cut.gen, cut.rank, cut.expected) == (0, 2, True)
    # noticed by the LM's own 5 s timeout, not by the harness's stall limit
    assert 4.5 < cut.latency_s < result.scenario.stall_s, cut
    print(f"partition detected after {cut.latency_s:.2f} s; world {[4, 2]}")


@pytest.mark.nightly   # the CI budget: a stall's stack shows in CI in test_abort_comms' retry
@pytest.mark.reshard(timeout=240)
def test_a_job_that_waits_out_a_partition_hangs_and_liveness_fails_it(reshard_run):
    """The planted bug: a collective timeout (60 s) longer than anyone waits for a step."""
    result = _lm(reshard_run, chaos.partition(rank=2, at_step=6), args=["--pg-timeout-s", "60"],
                 stall_s=8)
    v = result.verdicts["liveness"]
    assert v.status == "fail", v.message
    assert "stalled at step 6" in v.message and "no progress" in v.message, v.message
    # its stacks, from a file of its own (its output shares its node's log), down to the LM's
    assert "its main thread was in: " in v.message and "lm.py" in v.message, v.message
    assert not [d for d in result.history.detections() if d.kind == Detected.PARTITIONED]


@pytest.mark.nightly
@pytest.mark.reshard(timeout=240)
def test_a_partition_shorter_than_the_jobs_timeout_is_ridden_out(reshard_run):
    result = _lm(reshard_run, chaos.partition(rank=2, at_step=6, duration_s=2))
    result.assert_ok()
    assert [g.world_size for g in result.history.generations.values()] == [4]
    assert max(_step_times(result).values()) > 1.5   # the step that waited for the link


@pytest.mark.nightly   # the CI budget: throughput's fail case runs in CI (test_pipeline_checks)
@pytest.mark.reshard(timeout=240)
def test_a_slow_link_changes_no_verdict_and_throughput_reports_the_drop(reshard_run):
    """Capped at 16 Mbit/s, the LM's all-reduces take about 8x longer: every other checker
    passes, and a declared minimum of half the clean run's rate fails, naming the rate."""
    result = _lm(reshard_run, chaos.slow_link(rank=2, at_step=5, rate_mbit=16),
                 min_throughput=0.5)
    others = [c for c in result.verdicts if c != "throughput"]
    for check in others:
        assert result.verdicts[check].status == "pass", result.verdicts[check]
    v = result.verdicts["throughput"]
    assert v.status == "fail" and "of the fault-free run's" in v.message, v.message
    times = _step_times(result)
    before = sorted(t for s, t in times.items() if s < 5)
    after = sorted(t for s, t in times.items() if s > 5)
    assert after[len(after) // 2] > 3 * before[len(before) // 2], times
    print(f"slow link: {v.message}")


@pytest.mark.nightly   # the CI budget: tests/unit/test_watch_policies.py, test_checkers.py
@pytest.mark.reshard(timeout=240)
def test_a_link_change_that_cannot_be_made_fails_the_run_and_says_why(reshard_run):
    """A second rate cap on the same link: ``tc`` refuses it (the root qdisc exists). The rank
    notes that the fault was not made, and the run fails rather than pass untested."""
    result = reshard_run("lm", world_size=4, steps=12, launcher="elastic", nodes=2,
                         network="netns", faults=[chaos.slow_link(rank=2, at_step=3, rate_mbit=64),
                                                  chaos.slow_link(rank=2, at_step=5, rate_mbit=8)])
    (note,) = result.history.notes(NOT_INJECTED)
    assert (note.gen, note.rank, note.step) == (0, 2, 5) and "tc qdisc add" in note.fields["reason"]
    v = result.verdicts["liveness"]
    assert v.status == "fail" and "could not be injected: slow_link: `tc qdisc add" in v.message, v
    print(f"refused: {note.fields['reason']}")


@pytest.mark.nightly
@pytest.mark.reshard(timeout=240)
def test_a_lossy_link_changes_no_verdict(reshard_run):
    result = _lm(reshard_run, chaos.slow_link(rank=2, at_step=5, loss=0.05))
    result.assert_ok()
    print(f"lossy link: {result.verdicts['throughput'].message}")
