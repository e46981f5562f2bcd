"""Hypothesis strategies for schedules (valid by construction) and the suite profiles."""

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from pytest_reshard.schedule import strategies  # noqa: E402
from pytest_reshard.schedule import STANDARD_PHASES, validate  # noqa: E402

FAST = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])


@st.composite
def workloads(draw):
    """A workload shape and a schedule strategy's arguments for it."""
    world = draw(st.integers(1, 8))
    steps = draw(st.integers(1, 30))
    min_world = draw(st.integers(1, world))
    kinds = draw(st.lists(st.sampled_from(strategies.drawable()), min_size=1, unique=True))
    if NETWORK & set(kinds):   # one machine's power loss and one node's link never meet
        kinds = [k for k in kinds if k != "power_loss"]
    phases = draw(st.lists(st.sampled_from(STANDARD_PHASES + ("mine",)), min_size=1, unique=True))
    return dict(world_size=world, steps=steps, kinds=tuple(kinds), max_faults=draw(st.integers(0, 6)),
                min_world_size=min_world, phases=tuple(phases))


NETWORK = {"partition", "slow_link"}   # drawn for namespaced nodes only


def _options(kinds):
    """The options of a scenario that can run these kinds."""
    options = {"launcher": "elastic", "nodes": 2, "network": "netns", "multi_node": True} \
        if NETWORK & set(kinds) else {}
    return {**options, "devices": ["h100"]} if "change_devices" in kinds else options


@FAST
@given(st.data())
def test_every_generated_schedule_passes_validate(data):
    kw = data.draw(workloads())
    schedule = data.draw(strategies.schedules(**kw))
    validate(schedule, world_size=kw["world_size"], steps=kw["steps"], phases=kw["phases"],
             options=_options(kw["kinds"]))
    assert len(schedule.faults) <= kw["max_faults"]
    size, terminal_steps = kw["world_size"], []
    for f in schedule.faults:
        assert f.kind in kw["kinds"] and f.phase in kw["phases"] and 0 <= f.step < kw["steps"]
        assert f.target != "all" or f.kind not in ("kill", "hang", "crash_silently")
        if f.kind in ("kill", "hang", "crash_silently"):
            assert size >= 2  # never the only rank
        if f.target.startswith("rank:"):
            assert int(f.target[5:]) < size
        if f.terminal:
            terminal_steps.append(f.step)
        size = f.params.get("to_world_size", size)
        assert size >= kw["min_world_size"]
    assert len(terminal_steps) == len(set(terminal_steps))  # at most one terminal fault per step


@FAST
@given(strategies.schedules(4, 10, world_sizes=(2, 4), max_faults=4,
                            phases=("forward", "backward", "optimizer")))
def test_reshards_go_only_to_the_sizes_the_workload_supports(schedule):
    for f in schedule.faults:
        if f.kind == "shift_shards":
            assert f.params["to_world_size"] in (2, 4)
    validate(schedule, world_size=4, steps=10)


@FAST
@given(strategies.faults(3, 5, kinds=("kill",), phases=("backward",)))
def test_single_fault_strategy(fault):
    assert fault.kind == "kill" and fault.phase == "backward" and fault.step < 5
    assert fault.target in ("rank:0", "rank:1", "rank:2")


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="kinds"):
        strategies.schedules(2, 5, kinds=("explode",))
    with pytest.raises(ValueError, match="min_world_size"):
        strategies.schedules(2, 5, min_world_size=3)
    with pytest.raises(ValueError, match="phases"):
        strategies.schedules(2, 5, phases=())


def test_profiles_are_registered_with_hypothesis():
    ci, nightly = strategies.profile("ci"), strategies.profile("nightly")
    assert ci.max_examples == 10 and ci.derandomize and ci.database is None and ci.deadline is None
    assert nightly.max_examples == 50 and nightly.database is not None
    assert settings.get_profile("reshard-ci") is ci
    with pytest.raises(ValueError, match="ci, nightly"):
        strategies.profile("weekly")


def _profile_env(monkeypatch, env):
    if env is None:
        monkeypatch.delenv("RESHARD_PROFILE", raising=False)
    else:
        monkeypatch.setenv("RESHARD_PROFILE", env)


@pytest.mark.parametrize("args, env, ini, message", [
    (["--reshard-profile=weekly"], None, "", "*--reshard-profile='weekly': choose one of ci, nightly*"),
    ([], "fast", "", "*env RESHARD_PROFILE='fast': choose one of ci, nightly*"),
    ([], None, "reshard_profile = slow", "*ini reshard_profile='slow': choose one of ci, nightly*"),
])
def test_bad_profile_rejected_naming_its_source(pytester, monkeypatch, args, env, ini, message):
    _profile_env(monkeypatch, env)
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest(*args)
    assert result.ret != 0
    result.stderr.fnmatch_lines([message])


def test_strategies_is_an_importable_module_under_the_package():
    """``from pytest_reshard.strategies import schedules`` (the documented path) imports, and it is
    the same module as ``pytest_reshard.schedule.strategies`` and the package's attribute."""
    import pytest_reshard
    from pytest_reshard.schedule import strategies as home
    from pytest_reshard.strategies import schedules

    import pytest_reshard.strategies as alias

    assert alias is home and pytest_reshard.strategies is home and schedules is home.schedules


def test_the_wider_nemesis_is_drawable():
    assert {"abort_comms", "bitflip", "partition", "power_loss", "slow_link"} <= \
        set(strategies.drawable())
