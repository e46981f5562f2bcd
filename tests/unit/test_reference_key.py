"""The clean reference run's cache key: settings the clean run does not use do not rerun it."""
from __future__ import annotations

from pytest_reshard import chaos
from pytest_reshard.session import scenario_from
from pytest_reshard.session.references import UNUSED, UNUSED_DEFAULTS, ReferenceRuns

MIX = {"h100": 1, "a100": 1}


def _key(**options):
    scenario = scenario_from("lm", world_size=2, steps=6, **options)
    key, clean, shape = ReferenceRuns()._clean(scenario, scenario.initial_roles())
    return key, clean, shape


def test_scenarios_differing_only_in_settings_the_clean_run_does_not_use_share_a_key():
    key, clean, shape = _key(devices=MIX)
    for other in (dict(throttle="stretch"), dict(max_idle=0.3), dict(min_throughput=0.5),
                  dict(throttle="stretch", max_idle=0.25, phases=["eval"]),
                  dict(faults=[chaos.kill(target="rank:1", at_step=3)])):
        assert _key(devices=MIX, **other)[0] == key, other
    assert _key()[0] == key   # nor do the device classes: the clean run runs without them
    assert clean.devices is None and {k: shape[k] for k in UNUSED} == UNUSED_DEFAULTS


def test_the_clean_scenario_is_the_same_whoever_asked_for_it():
    """The cached run's own scenario says the defaults, not the first asker's thresholds."""
    _, clean, _ = _key(devices=MIX, throttle="stretch", max_idle=0.3, min_throughput=0.5)
    assert (clean.throttle, clean.max_idle, clean.min_throughput) == ("auto", 0.10, None)


def test_settings_that_change_the_clean_run_change_the_key():
    key = _key()[0]
    for other in (dict(steps=8), dict(hang_s=2.0), dict(memory_budget_bytes=2**30),
                  dict(args=["--lr", "0.1"]), dict(backend="nccl"), dict(world_size=3),
                  dict(files=True)):
        options = dict(world_size=2, steps=6) | other
        scenario = scenario_from("lm", **options)
        assert ReferenceRuns()._clean(scenario, scenario.initial_roles())[0] != key, other
