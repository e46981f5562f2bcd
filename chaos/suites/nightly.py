"""The nightly suite: property-based chaos over the bundled LM (generated schedules).

    pytest-reshard nightly -- --reshard-nightly --reshard-profile=nightly

Hypothesis draws whole fault schedules (kills, planned reshards, preemptions; valid by
construction, see ``pytest_reshard.schedule.strategies``) and every one must pass every checker. The
profile sets the budget: ``ci`` (the default) runs 10 derandomized examples, ``nightly`` 50 fresh
ones and remembers failures in ``.hypothesis/reshard``. A failure is shrunk to a minimal schedule
and its message ends with ``replay: pytest-reshard replay <artifacts>/<run>/scenario.json``,
which replays that exact schedule outside pytest.
"""
from pathlib import Path

import pytest

from pytest_reshard.schedule import strategies

pytestmark = [pytest.mark.nightly, pytest.mark.chaos]

WORLD, STEPS = 4, 12
LM_PHASES = ("data", "forward", "backward", "optimizer")  # marked on every LM step
SIZES = (1, 2, 3, 4)  # divide the LM's global batch (12)


@pytest.fixture(scope="module")
def session(pytestconfig):
    from pytest_reshard.session import Session

    root = pytestconfig.getoption("reshard_artifacts") or pytestconfig.getini("reshard_artifacts")
    with Session(Path(root).resolve() / "nightly") as s:
        yield s


def test_lm_survives_generated_schedules(session, pytestconfig):
    try:
        from hypothesis import given
    except ImportError:  # asked for explicitly: a skip here would be a silent green nightly
        pytest.fail("the nightly suite needs hypothesis: pip install 'pytest-reshard[test]'")

    from pytest_reshard.session import scenario_from

    seed = int(pytestconfig.getoption("reshard_seed") or pytestconfig.getini("reshard_seed"))

    @strategies.profile()
    @given(strategies.schedules(WORLD, STEPS, kinds=("kill", "abort_comms", "shift_shards", "preempt"),
                                max_faults=3, world_sizes=SIZES, phases=LM_PHASES, seed=seed))
    def prop(schedule):
        scenario = scenario_from("lm", world_size=WORLD, steps=STEPS, faults=schedule.faults,
                                 seed=schedule.seed, timeout_s=180)
        session.run(scenario, f"lm-{schedule.hash}").assert_ok()

    prop()
