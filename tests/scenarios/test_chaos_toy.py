"""The chaos catalog against a user's own script (tests/workloads/toy_train.py): each injector
fires where scheduled, is detected and named, and everything is cleaned up."""
import pytest

from pytest_reshard import chaos
from pytest_reshard.result import ReshardAssertionError

pytestmark = pytest.mark.reshard(world_size=4, steps=12, timeout=90)


def _fault_to_detect_s(result):
    fault = next(e["t"] for e in result.history.events if e["ev"] == "fault")
    detect = next(e["t"] for e in result.history.events if e["ev"] == "detect")
    return detect - fault


def test_silent_crash_is_detected_and_survived(reshard_run, toy):
    result = reshard_run(toy, faults=[chaos.crash_silently(rank=1, at_step=5, phase="backward")])
    result.assert_ok()
    [d] = result.history.detections()
    assert (d.kind, d.rank, d.step, d.phase, d.expected) == ("exited_early", 1, 5, "backward", True)
    assert _fault_to_detect_s(result) < 2.0  # measured 0.03-0.04 s (CI), 0.06 s at load 4.5


def test_blocked_rank_is_a_stall_named_and_recovered(reshard_run, toy):
    # stall_s: the toy's longest silence of all ranks while training measured 0.03 s (CI and at
    # load 4.5), 0.82 s in any toy run (a 400 MB allocation): 2 s is no false stall
    result = reshard_run(toy, stall_s=2, faults=[chaos.hang(rank=2, at_step=4, mode="block")])
    result.assert_ok()
    [d] = result.history.detections()
    assert (d.kind, d.rank, d.step, d.phase, d.expected) == ("stalled", 2, 4, "backward", True)


def test_straggler_shows_in_per_rank_timings(reshard_run, toy):
    result = reshard_run(toy, faults=[chaos.slow_rank(rank=2, at_step=3, steps=3, delay_ms=150)])
    result.assert_ok()
    def forward_s(rank, step):
        evs = [e for e in result.history.rank_events(gen=0, rank=rank) if e.get("step") == step]
        t = {e.get("phase", e["ev"]): e["t"] for e in evs if e["ev"] in ("point", "end")}
        return t["backward"] - t["forward"]
    assert all(forward_s(2, s) >= 0.15 for s in (3, 4, 5))
    # an unslowed forward measured <= 0.015 s (CI), 0.007 s at load 4.5: 10x under the delay
    assert forward_s(2, 6) < 0.15 and forward_s(0, 4) < 0.15


def _clean_peak(reshard_run, toy):
    clean = reshard_run(toy, memory_budget_bytes=64 * 2**30)
    clean.assert_ok()
    return max(e["peak_bytes"] for e in clean.history.events if e["ev"] == "rss")


def test_memory_pressure_past_the_budget_fails_loudly(reshard_run, toy):
    budget = _clean_peak(reshard_run, toy) + 150 * 2**20
    result = reshard_run(toy, memory_budget_bytes=budget,
                         faults=[chaos.memory_pressure(rank=1, at_step=4, bytes=300 * 2**20)])
    assert result.verdicts["memory_headroom"].status == "fail"
    with pytest.raises(ReshardAssertionError,
                       match=r"liveness FAIL: rank 1 exceeded its memory budget at step 4, phase begin"):
        result.assert_live()


def test_memory_headroom_passes_with_room_and_flags_a_tight_budget(reshard_run, toy):
    peak = _clean_peak(reshard_run, toy)
    reshard_run(toy, memory_budget_bytes=peak * 2).assert_memory_headroom()
    tight = reshard_run(toy, memory_budget_bytes=int(peak * 1.05))
    assert tight.verdicts["memory_headroom"].status == "fail"
    assert "headroom" in tight.verdicts["memory_headroom"].message


def test_a_peak_reached_just_before_exit_is_still_recorded(reshard_run, toy):
    """The supervisor samples RSS every 20 ms while a rank lives; the probe's exit event carries
    the rank's own peak, so an allocation right before a clean exit is not missed."""
    result = reshard_run(toy, world_size=2, steps=3, faults=[
        chaos.memory_pressure(rank=1, at_step=2, phase="end", bytes=400 * 2**20)])
    result.assert_ok()
    exit_peak = next(e["peak_rss"] for e in result.history.rank_events("exit", rank=1))
    recorded = max(e["peak_bytes"] for e in result.history.events
                   if e["ev"] == "rss" and e["rank"] == 1)
    assert exit_peak >= 400 * 2**20 and recorded >= exit_peak


# -- SIGTERM: the same semantics in the harness as in production -------------------------------
def test_a_script_that_never_asks_for_the_sigterm_flag_dies_of_a_preemption(reshard_run, toy):
    """No handler, never asks run.stop_requested(): SIGTERM ends it at once, as on a spot node,
    and the steps since its last checkpoint are lost: a planned preemption must cost nothing."""
    result = reshard_run(toy, world_size=2, args=["--ckpt-every", "4", "--ignore-sigterm-flag"],
                         faults=[chaos.preempt(at_step=6, phase="forward")])
    died = [d for d in result.history.detections() if d.kind == "died"]
    assert {d.rank for d in died} == {0, 1} and all(d.exit_code == -15 for d in died)
    ended = result.history.generations[0]
    assert ended.cause == "preempt" and ended.planned and "died of its SIGTERM" in ended.detail
    v = result.verdicts["no_rewind"]
    assert v.status == "fail" and "steps 4..5 replayed" in v.message, v.message


def test_a_users_own_sigterm_handler_is_still_called_and_the_flag_still_set(reshard_run, toy):
    result = reshard_run(toy, world_size=2, args=["--ckpt-every", "4", "--own-sigterm-handler"],
                         faults=[chaos.preempt(at_step=5, phase="forward")])
    result.assert_ok()
    assert sorted(p.name for p in result.run_dir.glob("sigterm-seen-*")) == ["sigterm-seen-0",
                                                                           "sigterm-seen-1"]


@pytest.mark.nightly   # the CI budget
def test_a_rank_still_tearing_down_when_the_grace_ends_is_not_a_failure(reshard_run, toy):
    """Every rank saved and recorded its exit within the grace period, but its process takes
    longer to end (as torch's teardown does on a loaded machine): the scheduler's SIGKILL ends
    it, and the preemption is a planned end, not 'still running when the grace period ran out'."""
    # grace_s: preempt -> every rank's recorded exit (its save included) measured 0.03 s (CI),
    # 0.06 s at load 4.5: 1.5 s is 25x that, and well under the 6 s teardown it must not cover
    result = reshard_run(toy, args=["--slow-teardown-s", "6"],
                         faults=[chaos.preempt(at_step=3, grace_s=1.5)])
    result.assert_ok()
    g0 = result.history.generations[0]
    assert (g0.cause, g0.planned) == ("preempt", True), (g0.cause, g0.detail)
