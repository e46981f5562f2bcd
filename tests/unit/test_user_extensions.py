"""A user's own fault kind and checker, declared in a conftest as the user guide shows, end to end:
the fault fires inside the rank at its point, the supervisor treats it as its declaration says,
and the checker shows in the verdict table, verdict.json, report.html and assert_ok()."""

import pytest

from pytest_reshard import chaos
from pytest_reshard.schedule import Schedule, ScheduleError, kinds, validate



def test_an_unknown_kind_is_rejected_before_anything_runs():
    with pytest.raises(ScheduleError, match="unknown fault kind 'no_such_kind'.*known kinds are"):
        validate(Schedule(0, [chaos.Fault("no_such_kind", "rank:0", 1, "forward")]),
                 world_size=2, steps=4)


def test_a_kind_needs_an_executor_the_rank_can_import():
    with pytest.raises(ValueError, match="module-level function"):
        kinds.FaultKind("inline", execute=lambda run, fault: None)
    with pytest.raises(ValueError, match="already registered"):
        kinds.register(kinds.FaultKind("kill", execute="somewhere:else"))


def test_what_a_kind_requires_of_the_scenario_is_checked_by_validate():
    with pytest.raises(ScheduleError, match="kill_node needs launcher='elastic'"):
        validate(Schedule(0, [chaos.kill_node(rank=0, at_step=1)]), world_size=2, steps=4,
                 options={"launcher": "fork"})


def test_an_unknown_workload_lists_the_registered_ones():
    from pytest_reshard import workloads

    with pytest.raises(FileNotFoundError, match=r"neither a registered workload \(.*dflash.*lm.*\) nor"):
        workloads.resolve("no-such-workload")
