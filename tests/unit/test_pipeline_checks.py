"""The pipeline checkers (sample_ledger, throughput) and role-aware topology, on hand-built
histories: no processes. Each must fail on the planted shape and pass on the correct one."""
from __future__ import annotations

from typing import Any, Callable

import pytest

from pytest_reshard import chaos, checkers
from pytest_reshard.history import History
from pytest_reshard.schedule import ScheduleError, resolve_target
from pytest_reshard.supervisor import default_roles, expand_roles, next_roles

ROLES = ["target", "target", "drafter", "drafter"]
BATCH = 8


def batch(step: int) -> list[int]:
    return list(range(step * BATCH, (step + 1) * BATCH))


def share(step: int, index: int, parts: int) -> list[int]:
    ids = batch(step)
    per = len(ids) // parts
    return ids[index * per:(index + 1) * per]


def pipeline(steps: int = 10, roles: list[str] = ROLES, *, seconds: float = 0.1,
             takes: Callable[[int, int], list[int]] | None = None,
             waits: Callable[[int, str], float] = lambda s, role: 0.0) -> History:
    """A correct run: targets and drafters split each batch evenly; drafter d of D takes share d.
    ``takes(step, drafter_index)`` overrides what a drafter received."""
    targets = [r for r, x in enumerate(roles) if x == "target"]
    drafters = [r for r, x in enumerate(roles) if x == "drafter"]
    events: list[dict[str, Any]] = [
        {"ev": "scenario", "t": 0.0, "workload": "dflash", "steps": steps, "world_size": len(roles),
         "seed": 0, "schedule": {"seed": 0, "faults": []}, "schedule_hash": "h", "replay": "r"},
        {"ev": "gen_start", "t": 0.0, "gen": 0, "world_size": len(roles), "roles": roles}]
    for r, role in enumerate(roles):
        events.append({"ev": "start", "t": 0.0, "gen": 0, "rank": r, "role": role, "world_size": len(roles)})
        events.append({"ev": "resumed", "t": 0.0, "gen": 0, "rank": r, "step": 0, "source": "fresh"})
    for s in range(steps):
        t = 1.0 + s * seconds
        for r, role in enumerate(roles):
            if role != "drafter":
                ids = share(s, targets.index(r), len(targets)) if role == "target" else \
                    share(s, r, len(roles))
            else:
                i = drafters.index(r)
                ids = takes(s, i) if takes else share(s, i, len(drafters))
            events += [{"ev": "begin", "t": t, "gen": 0, "rank": r, "step": s},
                       {"ev": "record", "t": t, "gen": 0, "rank": r, "step": s, "samples": ids,
                        "epoch": 0, "tokens": 10 * len(ids), "wait_s": waits(s, role)},
                       {"ev": "record", "t": t, "gen": 0, "rank": r, "step": s, "loss": 1.0},
                       {"ev": "end", "t": t + seconds / 2, "gen": 0, "rank": r, "step": s}]
    events.append({"ev": "gen_end", "t": 99.0, "gen": 0, "cause": "complete", "planned": False})
    return History.from_events(events)


# -- sample_ledger ---------------------------------------------------------------------------
def test_ledger_passes_when_every_made_sample_is_taken_once():
    v = checkers.sample_ledger(pipeline())
    assert v.status == "pass" and "80 samples crossed" in v.message


def test_ledger_names_a_dropped_share():
    v = checkers.sample_ledger(pipeline(takes=lambda s, i: share(s, i, 2)[:2] if i == 1 else share(s, i, 2)))
    assert v.status == "fail" and v.step == 0
    assert "2 samples made by target ranks never reached a drafter" in v.message
    assert "dropped instead of redistributed" in v.message


def test_ledger_names_a_batch_delivered_twice():
    # from step 5 on, drafter 0 takes its share of the previous batch: a resend after a restart
    v = checkers.sample_ledger(pipeline(takes=lambda s, i: share(s - 1 if s >= 5 and i == 0 else s, i, 2)))
    assert v.status == "fail" and v.step == 5 and v.rank == 2
    assert "made at step 4 (generation 0)" in v.message and "delivered twice" in v.message


def test_ledger_is_unknown_without_a_pipeline():
    h = pipeline(roles=["trainer"] * 2)
    assert checkers.sample_ledger(h).status == "unknown"
    assert not checkers.has_roles(h, *checkers.PIPELINE_ROLES)


# -- throughput ------------------------------------------------------------------------------
def test_throughput_passes_against_a_reference_of_the_same_speed():
    ref = pipeline()
    v = checkers.throughput(pipeline(), references={tuple(ROLES): ref}, min_fraction=0.9)
    assert v.status == "pass" and "(100%)" in v.message and "at least 90%" in v.message


def test_throughput_fails_below_the_declared_fraction_and_names_the_bottleneck():
    slow = pipeline(seconds=0.3, waits=lambda s, role: 0.25 if role == "target" else 0.0)
    v = checkers.throughput(slow, references={tuple(ROLES): pipeline()}, min_fraction=0.5)
    assert v.status == "fail" and v.generation == 0
    assert "33% of the fault-free run's" in v.message and "declared minimum 50%" in v.message
    assert "bottleneck: drafter" in v.message
    assert checkers.throughput(slow, references={tuple(ROLES): pipeline()},
                               min_fraction=0.3).status == "pass"
    undeclared = checkers.throughput(slow, references={tuple(ROLES): pipeline()})
    assert undeclared.status == "pass" and "no minimum rate declared" in undeclared.message


def test_throughput_fails_a_pool_that_silently_shrank_without_any_reference():
    # both drafters alive, drafter 1 idle: drafter 0 takes the whole batch (an alive drafter GPU at 0% utilisation)
    h = pipeline(takes=lambda s, i: batch(s) if i == 0 else [])
    v = checkers.throughput(h)
    assert v.status == "fail" and v.rank == 3
    assert "drafter rank 3 processed 0 tokens" in v.message
    assert "the drafter pool silently shrank to 1 of 2 working ranks" in v.message
    # samples and the ledger are fine: only throughput sees it
    assert checkers.sample_ledger(h).status == "pass"


def test_throughput_is_judged_per_cpu_other_processes_left():
    # the same work at a third of the speed, on 2 CPUs that other processes kept 2/3 busy
    def loaded(seconds: float, foreign: float) -> History:
        h = pipeline(seconds=seconds)
        for e in h.events:
            if e["ev"] == "record" and "tokens" in e:
                ours = 0.05 / 4   # each rank's CPU per step
                e.update(cpu_s=ours, busy_s=4 * ours + foreign * 2 * seconds, cpus=2)  # type: ignore[attr-defined]
        return History.from_events(h.events)
    ref = {tuple(ROLES): loaded(0.1, 0.0)}
    assert checkers.throughput(loaded(0.3, 2 / 3), references=ref, min_fraction=0.8).status == "pass"
    assert checkers.throughput(loaded(0.3, 0.0), references=ref, min_fraction=0.8).status == "fail"


def test_throughput_is_unknown_without_token_counts():
    h = pipeline()
    plain = History.from_events([{k: v for k, v in e.items() if k != "tokens"} for e in h.events])
    assert checkers.throughput(plain).status == "unknown"


# -- roles and topology ----------------------------------------------------------------------
def test_role_targets_pick_every_rank_or_one_drawn_from_the_seed():
    assert resolve_target("role:drafter", 4, ROLES, 0, 0) == [2, 3]
    one = resolve_target("role:drafter:one", 4, ROLES, 7, 1)
    assert len(one) == 1 and one[0] in (2, 3)
    assert resolve_target("role:drafter:one", 4, ROLES, 7, 1) == one  # replays pick the same
    assert chaos.kill(role="drafter", at_step=1).target == "role:drafter:one"
    assert chaos.preempt(role="target", at_step=1).target == "role:target"


def test_topology_changes_are_checked_before_any_process_starts():
    f = chaos.shift_shards(roles={"target": 3, "drafter": 1}, at_step=2)
    assert f.params == {"notice_s": 10.0, "roles": {"target": 3, "drafter": 1}, "to_world_size": 4}
    with pytest.raises(ScheduleError, match="name 4 ranks but to_world_size is 3"):
        chaos.shift_shards(roles={"target": 3, "drafter": 1}, to_world_size=3, at_step=2)
    with pytest.raises(ScheduleError, match="needs to_world_size"):
        chaos.shift_shards(at_step=2)
    with pytest.raises(ScheduleError, match="role:NAME:one"):
        chaos.kill(target="role:drafter:two", at_step=1)


def test_next_generation_roles():
    assert expand_roles({"target": 3, "drafter": 1}) == ["target"] * 3 + ["drafter"]
    assert next_roles(ROLES, 3, lost=2) == ["target", "target", "drafter"]   # a drafter died
    assert next_roles(ROLES, 3, lost=0) == ["target", "drafter", "drafter"]  # a target died
    assert next_roles(ROLES, 4, wanted={"target": 3, "drafter": 1}) == ["target"] * 3 + ["drafter"]
    assert next_roles(["trainer"] * 4, 2) == ["trainer"] * 2
    assert next_roles(["trainer"] * 2, 3) == ["trainer"] * 3
    assert default_roles("dflash", 4) == ROLES and default_roles("lm", 2) == ["trainer"] * 2
    with pytest.raises(ValueError, match="make the counts add up"):
        expand_roles({"target": 1}, 2)


def test_ledger_names_a_sample_routed_to_two_drafters():
    v = checkers.sample_ledger(pipeline(takes=lambda s, i: share(s, i, 2) + ([batch(s)[0]] if i == 1 else [])))
    assert v.status == "fail" and "reached two drafter ranks" in v.message


def test_an_idle_rank_fails_even_in_a_generation_too_short_for_a_rate():
    h = pipeline(steps=2, takes=lambda s, i: batch(s) if i == 0 else [])
    v = checkers.throughput(h)
    assert v.status == "fail" and "drafter rank 3 processed 0 tokens" in v.message
    assert checkers.throughput(pipeline(steps=2)).status == "pass"


def test_other_topology_for_the_noise_floor_keeps_every_role():
    empty = History.from_events([])
    assert checkers.noise_floor_roles(ROLES, empty) == ["target"] + ["drafter"] * 3
    assert checkers.noise_floor_roles(["target", "drafter"], empty) is None
    assert checkers.noise_floor_roles(["trainer"] * 4, empty) == ["trainer"] * 2
    assert next_roles(ROLES, 2) == ["target", "drafter"]  # a shrink never drops a whole role


def test_throughput_judges_a_device_mix_by_each_classs_share():
    """An A100-class rank's small share is the balance, not a pool that shrank; one far below
    its class's share still fails."""
    from pytest_reshard.contract import Ev
    from tests.histories import Builder

    def mixed(slow_tokens: int, devices: bool = True) -> History:
        b = Builder(steps=4)
        if devices:
            b.sup(Ev.DEVICES, gen=0, classes=["h100", "a100"], speeds=[1.0, 0.32],
                  mode="cgroup", why="")
        b.gen(run=range(4))
        for s in range(4):
            b.rank(0, 0, Ev.RECORD, step=s, tokens=100 - slow_tokens)
            b.rank(0, 1, Ev.RECORD, step=s, tokens=slow_tokens)
        return b.history()

    assert checkers.throughput(mixed(24, devices=False)).status == "fail"   # even shares due
    assert checkers.throughput(mixed(24)).status == "pass"                 # its class's share
    v = checkers.throughput(mixed(5))
    assert v.status == "fail" and v.rank == 1, v.message
    assert "their device classes' shares of the trainer work were 97" in v.message, v.message
