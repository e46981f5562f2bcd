import pytest

from pytest_reshard import chaos
from pytest_reshard.schedule import Fault, Schedule, ScheduleError, resolve_target


def test_schedule_round_trips_and_hash_is_stable():
    s = Schedule(5, [chaos.shift_shards(to_world_size=3, at_step=4),
                     chaos.kill(rank=1, at_step=7, phase="forward")])
    again = Schedule.from_dict(s.to_dict())
    assert again == s and again.hash == s.hash and len(s.hash) == 12
    assert Schedule(6, s.faults).hash != s.hash
    assert "kill(rank:1) at step 7 forward" in s.describe()


def test_random_targets_replay_from_the_seed():
    picks = {tuple(resolve_target("minority", 7, ["t"] * 7, seed=1, salt=2)) for _ in range(5)}
    assert len(picks) == 1 and len(next(iter(picks))) == 3
    assert resolve_target("role:drafter", 4, ["target", "target", "drafter", "drafter"], 0, 0) == [2, 3]


@pytest.mark.parametrize("make, message", [
    (lambda: chaos.kill(rank=1, role="x", at_step=1), "name the target once"),
    (lambda: chaos.preempt(at_step=1, grace_s=0), "grace_s must be > 0"),
    (lambda: chaos.shift_shards(to_world_size=0, at_step=1), "to_world_size must be >= 1"),
    (lambda: Fault("kill", "somebody", 1, "forward"), "bad fault target"),
    (lambda: Fault("kill", "all", -1, "forward"), "at_step must be an int >= 0"),
    (lambda: resolve_target("rank:5", 4, ["t"] * 4, 0, 0), "does not exist at world size 4"),
    (lambda: resolve_target("role:drafter", 2, ["t"] * 2, 0, 0), "no rank has role 'drafter'"),
])
def test_bad_faults_say_what_to_fix(make, message):
    with pytest.raises(ScheduleError, match=message):
        make()


from pytest_reshard.session import scenario_from  # noqa: E402


@pytest.mark.parametrize("faults, message", [
    ([chaos.kill(rank=4, at_step=1)], "rank 4 does not exist at step 1, where the world size is 4"),
    ([chaos.shift_shards(to_world_size=2, at_step=2), chaos.kill(rank=3, at_step=5)],
     "rank 3 does not exist at step 5, where the world size is 2"),
    ([chaos.kill(rank=0, at_step=10)], "the run has steps 0..9"),
    ([chaos.kill(target="all", at_step=3)], "takes down every rank"),
    ([chaos.kill(rank=0, at_step=3, phase="bakward")], "unknown phase 'bakward'"),
    ([chaos.kill(rank=0, at_step=3), chaos.preempt(at_step=3, phase="backward")], "conflicts with"),
])
def test_schedules_are_validated_before_any_process_starts(faults, message):
    with pytest.raises(ScheduleError, match=message):
        scenario_from("lm", world_size=4, steps=10, faults=faults)


def test_custom_phases_and_nested_fault_lists_are_accepted():
    sc = scenario_from("lm", world_size=4, steps=10, phases=["loss_scale"],
                       faults=[chaos.drain(world_size=4, at_step=2),
                               chaos.kill(rank=0, at_step=8, phase="loss_scale")])
    assert [f.kind for f in sc.schedule.faults] == ["shift_shards", "shift_shards", "kill"]


@pytest.mark.parametrize("kwargs, words", [
    ({}, "name the file event by event="), ({"event": 3, "path": "a.pt"}, "one of them"),
    ({"event": 3, "op": "open"}, "op= goes with path="), ({"path": "a.pt", "op": "scribble"},
                                                           "op must be a file operation")])
def test_a_file_event_is_named_by_its_count_or_its_path(kwargs, words):
    for make in (chaos.kill_at_file_event, chaos.power_loss):
        with pytest.raises(ScheduleError, match=words):
            make(at_step=1, **kwargs)
    assert chaos.power_loss(at_step=1, path="/ckpt/latest/", op="rename").params == \
        {"path": "ckpt/latest", "op": "rename"}


@pytest.mark.parametrize("fault", [chaos.partition(rank=2, at_step=1),
                                   chaos.slow_link(rank=2, at_step=1, loss=0.1)])
@pytest.mark.parametrize("options", [{"launcher": "fork"},
                                     {"launcher": "elastic", "nodes": 2, "network": "loopback"},
                                     {"launcher": "elastic", "nodes": 1}])
def test_a_network_fault_needs_two_namespaced_nodes_and_says_so(fault, options):
    with pytest.raises(ScheduleError, match="namespaced nodes"):
        scenario_from("lm", world_size=4, steps=4, faults=[fault], **options)


@pytest.mark.parametrize("kwargs, words", [
    ({}, "rate_mbit=, loss= or delay_ms="), ({"loss": 1.5}, "a fraction in"),
    ({"rate_mbit": 0}, "rate_mbit must be > 0"), ({"delay_ms": 5, "jitter_ms": -1}, "jitter_ms")])
def test_a_slow_link_says_what_it_needs(kwargs, words):
    with pytest.raises(ScheduleError, match=words):
        chaos.slow_link(rank=0, at_step=1, **kwargs)
    with pytest.raises(ScheduleError, match="direction"):
        chaos.partition(rank=0, at_step=1, direction="sideways")


def test_a_device_change_needs_known_classes_and_a_heterogeneous_world():
    with pytest.raises(ScheduleError, match="one known class per rank"):
        chaos.change_devices(devices=["h100", "tpu"], at_step=2)
    change = chaos.change_devices(devices={"a100": 1, "l40s": 2}, at_step=2)
    assert change.params["devices"] == ["a100", "l40s", "l40s"] and \
        change.params["to_world_size"] == 3
    with pytest.raises(ScheduleError, match="give the scenario devices="):
        scenario_from("lm", world_size=4, steps=6, faults=[change])
    scenario_from("lm", world_size=2, steps=6, faults=[change], devices=["h100", "a100"])


def test_a_migration_names_a_rank_of_the_world_in_effect():
    with pytest.raises(ScheduleError, match="a rank >= 0"):
        chaos.migrate(-1, at_step=2)
    move = chaos.migrate(3, at_step=2, notice_s=5)
    assert (move.kind, move.target, move.params) == ("migrate", "all", {"rank": 3, "notice_s": 5.0})
    scenario_from("lm", world_size=4, steps=6, faults=[move])
    with pytest.raises(ScheduleError, match="rank 3 does not exist at step 4, where the world "
                                            "size is 3"):
        scenario_from("lm", world_size=4, steps=6, faults=[
            chaos.shift_shards(to_world_size=3, at_step=1), chaos.migrate(3, at_step=4)])


def test_an_unknown_scenario_option_is_refused_with_the_list_of_options():
    with pytest.raises(ValueError, match="no scenario option 'stall': the options are args, "
                                         "timeout_s, .*stall_s"):
        scenario_from("lm", world_size=2, steps=4, stall=5)
