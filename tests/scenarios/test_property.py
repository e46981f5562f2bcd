"""Property-based chaos on the toy workload: generated schedules, shrinking, replay.

One runner Session serves the whole module (warm fork server, cached reference runs), so a
generated schedule costs about a second. The scenarios are small (2 ranks, 5 steps) on purpose.
"""
import json
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
# E402: these need hypothesis, which the importorskip above checks first
from hypothesis import given, seed  # noqa: E402

from pytest_reshard import cli  # noqa: E402
from pytest_reshard.result import ReshardAssertionError  # noqa: E402
from pytest_reshard.schedule import Schedule, strategies  # noqa: E402
from pytest_reshard.session import Session, scenario_from  # noqa: E402

pytestmark = pytest.mark.chaos

TOY = str(Path(__file__).parent.parent / "workloads" / "toy_train.py")
WORLD, STEPS = 2, 5
TOY_ARGS = ["--ckpt-every", "2"]
BUG = "--bug-reshard-after-kill"
# The toy marks forward and optimizer (plus the implicit begin/end); two phases keep the space
# small enough that 10 examples reach the interesting interleavings.
PHASES = ("forward", "optimizer")
KINDS = ("kill", "shift_shards")


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    with Session(tmp_path_factory.mktemp("property")) as s:
        yield s


def run_toy(session, schedule: Schedule, args, tag):
    scenario = scenario_from(TOY, world_size=WORLD, steps=STEPS, faults=schedule.faults,
                             seed=schedule.seed, args=TOY_ARGS + list(args), timeout_s=60)
    return session.run(scenario, f"{tag}-{schedule.hash}")


def toy_schedules(kinds=KINDS):
    # World sizes the toy supports: divisors of its global batch (12). Faults stay off the last
    # step only so that the pinned seed below keeps drawing the same examples (a notice on the
    # last step once made the supervisor report an early exit; this test found it, and
    # test_planned_reshard_at_the_last_step_completes_the_run now covers it).
    return strategies.schedules(WORLD, STEPS - 1, kinds=kinds, max_faults=3, world_sizes=(1, 2),
                                phases=PHASES)


def test_correct_toy_passes_every_checker_on_generated_schedules(session):
    ran = []

    @strategies.profile("ci")
    @given(toy_schedules(kinds=("kill", "shift_shards", "preempt")))
    def prop(schedule):
        result = run_toy(session, schedule, [], "ok")
        ran.append(schedule)
        result.assert_ok()

    prop()
    assert len(ran) >= 5 and any(s.faults for s in ran)


# The seed pins the examples the ci profile draws (derandomize would pin them too, but from the
# test's source, so any edit here would change them). About one generated schedule in five
# hits the bug: about 60% of seeds find it within the ci profile's 10 examples (nightly's 50
# examples almost always do); this seed finds it at the third example.
@pytest.mark.nightly   # 50 s on 2 cores: the nightly workflow runs the project's nightly tests
def test_property_finds_reshard_after_kill_and_shrinks_it(session, tmp_path):
    failing = []  # (schedule, result) of every failing run, in order

    @seed(20261134)
    @strategies.profile("ci")
    @given(toy_schedules())
    def prop(schedule):
        result = run_toy(session, schedule, [BUG], "bug")
        if result.verdict.status != "pass":
            failing.append((schedule, result))
        result.assert_ok()

    with pytest.raises(ReshardAssertionError) as e:
        prop()
    # Hypothesis runs the minimal failing example last, then raises its error.
    schedule, result = failing[-1]
    print("minimal failing schedule:", schedule.describe())
    print("replay:", result.replay)
    kill, reshard = schedule.faults  # exactly two faults ...
    assert (kill.kind, reshard.kind) == ("kill", "shift_shards")  # ... a kill, then a reshard
    assert kill.step < reshard.step <= kill.step + 3
    failed = sorted(n for n, v in result.verdicts.items() if v.status == "fail")
    assert "no_rewind" in failed
    message = str(e.value)
    assert "no_rewind FAIL" in message and result.replay in message
    # The printed command replays the exact schedule from its artifacts, with the same verdict.
    assert result.replay.startswith("pytest-reshard replay ")
    scenario_json = result.run_dir / "scenario.json"
    assert json.loads(scenario_json.read_text())["schedule"] == schedule.to_dict()
    rc = cli.main(["replay", str(scenario_json), "--artifacts", str(tmp_path)])
    assert rc == 1
    replayed = json.loads((tmp_path / f"replay-{schedule.hash}" / "verdict.json").read_text())
    assert replayed["schedule_hash"] == schedule.hash
    assert sorted(n for n, c in replayed["checks"].items() if c["status"] == "fail") == failed


def test_stateful_schedules_keep_the_checkers_invariant(session):
    """The stateful mode: rules compose train/kill/shift_shards/preempt; the checkers hold."""
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    machine = strategies.schedule_machine(lambda s: run_toy(session, s, [], "stateful"),
                                          WORLD, STEPS, world_sizes=(1, 2), phase="forward")
    ran = []
    original = machine.teardown

    def counting_teardown(self):
        ran.append(list(self.faults))
        original(self)

    machine.teardown = counting_teardown
    run_state_machine_as_test(machine, settings=settings(
        strategies.profile("ci"), max_examples=4, stateful_step_count=4))
    assert any(ran), "no example added a fault"
