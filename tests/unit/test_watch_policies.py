"""The watch loop's pure parts: the typed pending end and the policies' protocol."""
from pytest_reshard.contract import Cause, Ev, RunDir
from pytest_reshard.schedule import kinds
from pytest_reshard.supervisor.outcome import PendingEnd
from pytest_reshard.supervisor.policies import GenerationPolicy
from pytest_reshard.supervisor.policies.in_place import InPlace
from pytest_reshard.supervisor.policies.membership import Membership
from pytest_reshard.supervisor.policies.relaunch import Relaunch


def test_a_workloads_own_drain_request_is_a_pending_end_of_its_own():
    ev = {"ev": Ev.REQUEST.value, "gen": 0, "rank": 1, "step": 4, "to_world_size": 2,
          "reason": "ECC error", "grace_s": 5}
    end = PendingEnd.of_request(ev, fault_id=3, now=100.0)
    assert (end.cause, end.fault_id, end.deadline, end.requested, end.label) == \
        (Cause.DRAIN, 3, 105.0, True, "drain")
    out = end.outcome(world_size=4, seed=0, sigtermed=set())
    assert (out.cause, out.planned, out.next_world_size, out.fault_id) == (Cause.DRAIN, True, 2, 3)
    assert out.detail == "the workload asked to drain to 2 ranks: ECC error"
    missed = end.missed([0, 1], gen=0)
    assert missed.cause is Cause.FAILURE and missed.detail.startswith(
        "drain at step 4 request: ranks [0, 1] were still running when the grace period ran out")


def test_a_fired_planned_fault_is_a_pending_end_with_its_kinds_cause():
    ev = {"ev": Ev.FAULT.value, "id": 0, "kind": "shift_shards", "step": 2, "phase": "optimizer",
          "params": {"notice_s": 20, "to_world_size": 3}}
    end = PendingEnd.of_fault(ev, kinds.get("shift_shards"), deadline=1.0)
    assert (end.cause, end.requested, end.label) == (Cause.RESHARD, False, "shift_shards")
    out = end.outcome(world_size=4, seed=0, sigtermed={2})
    assert out.next_world_size == 3 and out.detail.startswith("shift_shards at step 2 optimizer")
    assert "rank 2 died of its SIGTERM" in out.detail
    assert "notice ran out" in end.missed([1], gen=0).detail


def test_every_policy_answers_the_whole_protocol():
    hooks = [n for n in vars(GenerationPolicy) if not n.startswith("_")]
    assert set(hooks) >= {"start", "on_fault", "on_live", "poll", "on_death", "on_all_exited",
                          "handed_over", "outcome"}
    for policy in (Relaunch, InPlace, Membership):
        missing = [h for h in hooks if not callable(getattr(policy, h, None))]
        assert not missing, f"{policy.__name__} lacks {missing}"


def test_a_wall_clock_step_does_not_make_a_beating_rank_look_silent(monkeypatch, tmp_path):
    """The heartbeat's silence is measured on the monotonic clock from when its beat last moved:
    an hour's step of the wall clock between two beats is not an hour of silence."""
    from types import SimpleNamespace

    from pytest_reshard.supervisor import detect

    beats = {0: 1000.0}
    loop = SimpleNamespace(live=SimpleNamespace(last_beat=beats.get), gen=0,
                           ctx=SimpleNamespace(run_dir=RunDir(tmp_path)))
    clock = {"wall": 1000.05, "mono": 50.0}
    monkeypatch.setattr(detect.time, "time", lambda: clock["wall"])
    monkeypatch.setattr(detect.time, "monotonic", lambda: clock["mono"])
    ranks = detect.RankWatch(loop)
    assert abs(ranks.silent_for(0) - 0.05) < 1e-9        # first sight: its wall-clock age
    clock["wall"] += 3600.0                              # NTP steps the clock an hour ahead
    clock["mono"] += 0.05
    assert abs(ranks.silent_for(0) - 0.1) < 1e-9         # not 3600 s
    beats[0] = clock["wall"]                             # the next beat, on the new clock
    clock["mono"] += 0.05
    assert ranks.silent_for(0) == 0.0
    clock["mono"] += 30.0                                # then it really stops beating
    assert ranks.silent_for(0) == 30.0
    assert ranks.silent_for(1) is None                   # never attached


def _watch(fired: list[dict], events: list[dict], world_size: int = 4):
    """What ``Watch``'s fault lookups read: the fired faults and the tail's events."""
    from types import SimpleNamespace

    from pytest_reshard.supervisor.watch import Watch

    by_rank: dict[int, list[dict]] = {}
    for e in events:
        by_rank.setdefault(e["rank"], []).append(e)
    tail = SimpleNamespace(events=lambda gen, rank: by_rank.get(rank, []) if gen == 0 else [])
    loop = SimpleNamespace(gen=0, world_size=world_size, tail=tail, _note=Watch._note,
                           fired={f["id"]: f for f in fired})
    return loop, Watch


CUT = {"ev": Ev.FAULT.value, "gen": 0, "rank": 2, "id": 0, "kind": "partition", "step": 6,
       "phase": "backward", "params": {"direction": "both"}, "node": 1, "t": 100.0}


def _changed(duration_s, t=100.1):
    from pytest_reshard.contract import LINK_CHANGED

    return {"ev": Ev.NOTE.value, "gen": 0, "rank": 2, "what": LINK_CHANGED, "fault_id": 0,
            "node": 1, "duration_s": duration_s, "t": t}


def test_a_partition_whose_rules_never_went_in_explains_nothing():
    """The fault fired, but iptables failed: no node is fenced, no death is excused."""
    from pytest_reshard.contract import NOT_INJECTED

    refused = {"ev": Ev.NOTE.value, "gen": 0, "rank": 2, "what": NOT_INJECTED, "fault_id": 0,
               "reason": "partition: `iptables -I INPUT -i rs0 -j DROP` failed", "t": 100.1}
    loop, Watch = _watch([CUT], [CUT, refused])
    assert Watch._cut_off(loop) is None
    assert Watch.fault_for(loop, 2, kinds.Ending.DEATH) is None
    loop, Watch = _watch([CUT], [CUT, _changed(None)])
    assert Watch._cut_off(loop)["node"] == 1                 # went in: to the end of the run
    assert Watch.fault_for(loop, 2, kinds.Ending.DEATH) is CUT


def test_a_healed_partition_explains_a_death_only_until_the_job_trains_again(monkeypatch):
    from pytest_reshard.supervisor import watch

    monkeypatch.setattr(watch.time, "time", lambda: 200.0)
    stuck = [CUT, _changed(2.0)]                         # healed at 102.1, nothing ended since
    loop, Watch = _watch([CUT], stuck)
    assert Watch._cut_off(loop) is not None              # a timeout that fired after the heal
    trained = stuck + [{"ev": Ev.END.value, "gen": 0, "rank": 0, "step": 7, "t": 103.0}]
    loop, Watch = _watch([CUT], trained)
    assert Watch._cut_off(loop) is None                  # a later death is the job's own
    monkeypatch.setattr(watch.time, "time", lambda: 101.0)
    loop, Watch = _watch([CUT], stuck)
    assert Watch._cut_off(loop) is not None              # still cut
