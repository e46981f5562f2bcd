"""The probe in-process: events, faults at points, and the no-op outside the harness."""
import json
import math
import os

import pytest

from pytest_reshard import probe
from pytest_reshard.history import History


def make_run(tmp_path, faults=()):
    (tmp_path / "events").mkdir()
    (tmp_path / "plan-g0.json").write_text(json.dumps(
        {"seed": 3, "world_size": 2, "roles": ["trainer", "drafter"], "faults": list(faults)}))
    env = {"RESHARD_DIR": str(tmp_path), "RESHARD_GENERATION": "0", "RANK": "1", "WORLD_SIZE": "2"}
    return probe.Run(env, max_rewind_steps=2)


def events(tmp_path):
    return [json.loads(line) for line in (tmp_path / "events" / "g0-r1.jsonl").read_text().splitlines()]


def test_inactive_outside_the_harness(tmp_path):
    run = probe.Run({})
    assert not run.active and run.workdir is None
    with run.step(0) as s:
        s.point("forward")
        s.record(loss=1.0, samples=[1])
    run.close()
    assert not run.reshard_requested() and not run.stop_requested()


def test_events_round_trip_through_history(tmp_path):
    run = make_run(tmp_path)
    assert run.role == "drafter" and run.seed == 3 and run.workdir == tmp_path / "work"
    run.resumed(4)
    with run.step(4) as s:
        s.record(samples=[7, 8], epoch=1)
        s.point("forward")
        s.record(loss=float("nan"), grad_norm=0.5)
    with pytest.raises(ValueError):
        with run.step(5) as s:
            s.point("backward")
            raise ValueError("boom")
    run.checkpoint_saved(4, {"model": "ab"})
    run.close()
    evs = events(tmp_path)
    assert [e["ev"] for e in evs] == ["start", "resumed", "begin", "record", "point", "record",
                                      "end", "begin", "point", "error", "ckpt_save", "exit"]
    assert evs[0]["max_rewind_steps"] == 2 and evs[0]["role"] == "drafter"
    assert evs[3]["samples"] == [7, 8] and evs[3]["epoch"] == 1
    assert math.isnan(evs[5]["loss"]) and evs[5]["grad_norm"] == 0.5
    assert evs[9]["phase"] == "backward" and "boom" in evs[9]["error"]
    assert History.load(tmp_path).ended(0) is not None


def test_shift_shards_fires_exactly_at_its_point(tmp_path):
    run = make_run(tmp_path, [{"id": 0, "kind": "shift_shards", "ranks": [1], "step": 2,
                               "phase": "optimizer", "params": {"to_world_size": 1, "notice_s": 5}}])
    for step in range(3):
        with run.step(step) as s:
            s.point("forward")
            assert not run.reshard_requested()
            s.point("optimizer")
    notice = run.reshard_requested()
    assert notice and notice.to_world_size == 1
    fired = [e for e in events(tmp_path) if e["ev"] == "fault"]
    assert [(e["step"], e["phase"], e["kind"]) for e in fired] == [(2, "optimizer", "shift_shards")]


def test_faults_for_other_ranks_do_not_fire(tmp_path):
    run = make_run(tmp_path, [{"id": 0, "kind": "kill", "ranks": [0], "step": 0,
                               "phase": "forward", "params": {}}])
    with run.step(0) as s:
        s.point("forward")  # would SIGKILL this test process if it fired on rank 1
    assert not [e for e in events(tmp_path) if e["ev"] == "fault"]


def test_digest_is_bit_exact_and_layout_independent():
    torch = pytest.importorskip("torch")
    a = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "step": 3}
    b = {"step": 3, "w": torch.arange(6, dtype=torch.float32).reshape(2, 3).t().contiguous().t()}
    assert probe.digest(a) == probe.digest(b)
    c = {"w": a["w"].clone(), "step": 3}
    c["w"][0, 0] = torch.nextafter(c["w"][0, 0], torch.tensor(1.0))
    assert probe.digest(a) != probe.digest(c)


def test_callback_driven_steps_record_the_same_events_as_the_with_block(tmp_path):
    """begin_step/end_step (a framework's on_step_begin/on_step_end) and run.point after a step
    (a save between steps) give the history a with-block would; faults fire at their points."""
    fired = {"id": 0, "kind": "slow_rank", "ranks": [1], "step": 2, "phase": "checkpoint",
             "params": {"delay_ms": 1.0, "steps": 1}}
    run = make_run(tmp_path, faults=[fired])
    run.resumed(0)
    for step in range(3):
        s = run.begin_step(step)
        s.point("forward")
        s.record(loss=1.0 / (step + 1))
        run.end_step()
    run.point("checkpoint", step=2)          # the save after step 2, outside its step
    run.begin_step(3).point("backward")
    run.end_step(error=RuntimeError("boom"))
    with pytest.raises(RuntimeError, match="without begin_step"):
        run.end_step()
    run.close()
    evs = events(tmp_path)
    assert [(e["ev"], e.get("step")) for e in evs if e["ev"] in ("begin", "end", "error")] == [
        ("begin", 0), ("end", 0), ("begin", 1), ("end", 1), ("begin", 2), ("end", 2),
        ("begin", 3), ("error", 3)]
    assert [(e["kind"], e["step"], e["phase"]) for e in evs if e["ev"] == "fault"] == [
        ("slow_rank", 2, "checkpoint")]
    h = History.load(tmp_path)
    assert sorted(h.ended()) == [0, 1, 2] and 3 not in h.ended()
    inactive = probe.Run({})
    inactive.begin_step(0)
    inactive.end_step()   # a no-op outside the harness, like the with block


def test_live_reshard_hands_the_rank_to_the_next_generation(tmp_path, monkeypatch):
    # rejoin points this process's environment at the new world: give it one to change
    monkeypatch.setattr(os, "environ", {"RESHARD_DIR": str(tmp_path), "RANK": "1"})
    run = make_run(tmp_path)
    (tmp_path / "plan-g1.json").write_text(json.dumps(
        {"seed": 3, "world_size": 3, "roles": ["trainer"] * 3, "faults": []}))
    answer = {"gen": 1, "world_size": 3, "old_world_size": 2, "survivors": [1, 0],
              "master_addr": "127.0.0.1", "master_port": 4321, "step": 6}
    (tmp_path / "live-g0.json").write_text(json.dumps(answer))
    change = run.live_reshard(6)
    assert (change.generation, change.rank, change.survivors) == (1, 0, (1, 0))
    new = run.rejoin(change)
    assert (new.generation, new.rank, new.world_size, new.role) == (1, 0, 3, "trainer")
    assert os.environ["MASTER_PORT"] == "4321" and os.environ["RESHARD_GENERATION"] == "1"
    new.close()
    old = events(tmp_path)
    assert [e["ev"] for e in old[-2:]] == ["live", "exit"] and old[-2]["step"] == 6
    assert old[-1]["moved_to"] == {"gen": 1, "rank": 0}
    assert not run.active  # its part of generation 0 is over: nothing more is recorded there
    moved = [json.loads(x) for x in (tmp_path / "events" / "g1-r0.jsonl").read_text().splitlines()]
    assert [e["ev"] for e in moved] == ["start", "exit"] and moved[0]["max_rewind_steps"] == 2

    # A process started for the new world finds the change; a refusal is raised with its reason.
    joiner = probe.Run({"RESHARD_DIR": str(tmp_path), "RESHARD_GENERATION": "1", "RANK": "2",
                        "WORLD_SIZE": "3", "RESHARD_JOIN": "0"})
    assert joiner.joining is not None and joiner.joining.rank == 2
    (tmp_path / "live-g0.json").write_text(json.dumps({"error": "launcher 'x' cannot"}))
    again = probe.Run({"RESHARD_DIR": str(tmp_path), "RESHARD_GENERATION": "0", "RANK": "0",
                       "WORLD_SIZE": "2"})
    with pytest.raises(RuntimeError, match="cannot reshard in place: launcher 'x' cannot"):
        again.live_reshard(6)


def test_executors_act_through_the_runs_public_interface(tmp_path):
    """A straggler over two steps (``repeat_fault``: one fault event, two sleeps), memory
    pressure (``hold``) and a notice (``notify_reshard``), with no private attribute touched."""
    run = make_run(tmp_path, [
        {"id": 0, "kind": "slow_rank", "ranks": [1], "step": 0, "phase": "forward",
         "params": {"delay_ms": 1.0, "steps": 2}},
        {"id": 1, "kind": "memory_pressure", "ranks": [1], "step": 1, "phase": "begin",
         "params": {"bytes": 1 << 16}},
        {"id": 2, "kind": "shift_shards", "ranks": [1], "step": 2, "phase": "end",
         "params": {"to_world_size": 1, "notice_s": 5}}])
    for step in range(3):
        with run.step(step) as s:
            s.point("forward")
    evs = events(tmp_path)
    assert [(e["step"], e["kind"]) for e in evs if e["ev"] == "fault"] == \
        [(0, "slow_rank"), (1, "memory_pressure"), (2, "shift_shards")]
    assert [e["step"] for e in evs if e["ev"] == "point"] == [0, 1, 2]
    notice = [e for e in evs if e["ev"] == "notice"]
    assert len(notice) == 1 and notice[0]["to_world_size"] == 1
    assert run.reshard_requested().deadline == notice[0]["deadline"]
    assert not run._faults  # the repeat at step 1 fired and was consumed
