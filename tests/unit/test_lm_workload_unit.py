"""Unit tests of the LM workload's pure parts: data order, digests, checkpoint and snapshot files.

No processes are started here; the multi-rank behaviour is covered by the harness's own tests.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from pytest_reshard.fixtures import _common as C


# -- data order --------------------------------------------------------------------------------
def test_sampler_is_deterministic_and_each_epoch_is_a_permutation():
    a, b = C.EpochSampler(24, 6, seed=3), C.EpochSampler(24, 6, seed=3)
    batches = [a.next_batch() for _ in range(8)]
    assert batches == [b.next_batch() for _ in range(8)]
    for epoch in (0, 1):
        ids = [i for e, batch in batches if e == epoch for i in batch]
        assert sorted(ids) == list(range(24))
    assert a.permutation(0) != a.permutation(1)
    assert C.EpochSampler(24, 6, seed=4).permutation(0) != a.permutation(0)


def test_sampler_state_is_canonical_at_epoch_end():
    s = C.EpochSampler(12, 4, seed=0)
    s.skip(3)
    assert s.state_dict() == {"epoch": 1, "position": 0}


def test_sampler_resumes_at_its_saved_position():
    s = C.EpochSampler(60, 12, seed=7)
    s.skip(7)
    state = s.state_dict()
    expected = [s.next_batch() for _ in range(5)]
    t = C.EpochSampler(60, 12, seed=7)
    t.load_state_dict(state)
    assert [t.next_batch() for _ in range(5)] == expected


def test_world_size_changes_consume_every_sample_exactly_once():
    """4 ranks for 3 steps, then 3 ranks, then 2 (resuming from the saved position each time)."""
    seen: Counter[int] = Counter()
    state = None
    for world, steps in ((4, 3), (3, 4), (2, 3)):  # 10 steps of 12 = one epoch of 120
        s = C.EpochSampler(120, 12, seed=1)
        if state:
            s.load_state_dict(state)
        for _ in range(steps):
            epoch, ids = s.next_batch()
            assert epoch == 0
            shares = [C.rank_slice(ids, r, world) for r in range(world)]
            assert [i for share in shares for i in share] == ids  # contiguous, in rank order
            for share in shares:
                seen.update(share)
        state = s.state_dict()
    assert sorted(seen) == list(range(120)) and set(seen.values()) == {1}
    assert state == {"epoch": 1, "position": 0}


def test_bad_batch_shapes_are_rejected_with_the_reason():
    with pytest.raises(ValueError, match="multiple of global_batch"):
        C.EpochSampler(100, 12, seed=0)
    with pytest.raises(ValueError, match="not divisible by world size"):
        C.rank_slice(list(range(12)), 0, 5)


def test_synthetic_samples_depend_only_on_seed_and_id():
    lm = pytest.importorskip("pytest_reshard.fixtures.lm")
    a = lm.sample_tokens(0, 5, 33, 256)
    assert a == lm.sample_tokens(0, 5, 33, 256)
    assert a != lm.sample_tokens(1, 5, 33, 256) and a != lm.sample_tokens(0, 6, 33, 256)
    assert len(a) == 33 and all(0 <= t < 256 for t in a)


# -- configuration -----------------------------------------------------------------------------
def test_cli_flags_come_from_the_config_dataclass():
    lm = pytest.importorskip("pytest_reshard.fixtures.lm")
    cfg = lm.parse_args([])
    assert cfg == lm.LMConfig()
    cfg = lm.parse_args(["--steps", "7", "--replicas", "2", "--no-digest", "--bug", "quit_early"])
    assert (cfg.steps, cfg.replicas, cfg.digest, cfg.bug) == (7, 2, False, "quit_early")
    assert cfg.dataset_size % cfg.global_batch == 0
    for world in (4, 3, 2, 1):
        assert cfg.global_batch % world == 0
    with pytest.raises(SystemExit):
        lm.parse_args(["--bug", "no_such_bug"])
    assert set(C.field_docs(lm.LMConfig)) == {f.name for f in dataclasses.fields(lm.LMConfig)}


def test_replicas_fall_back_to_a_divisor_of_the_world_size():
    lm = pytest.importorskip("pytest_reshard.fixtures.lm")
    assert [lm.effective_replicas(2, w) for w in (4, 3, 2, 1)] == [2, 1, 2, 1]
    assert lm.effective_replicas(1, 4) == 1


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    lm = pytest.importorskip("pytest_reshard.fixtures.lm")
    cfg = lm.LMConfig(warmup_steps=4, decay_steps=20, min_lr_ratio=0.1)
    f = lm.lr_lambda(cfg)
    assert [f(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(4) == 1.0 and f(12) < f(5) and f(20) == pytest.approx(0.1) and f(100) == pytest.approx(0.1)


# -- digests -----------------------------------------------------------------------------------
def _extra(position=0):
    torch = pytest.importorskip("torch")
    return {"lr_scheduler": {"last_epoch": 3, "_last_lr": [0.001]},
            "data": {"epoch": 0, "position": position}, "rng": torch.get_rng_state()}


def test_digest_names_every_component_and_ignores_dict_order():
    torch = pytest.importorskip("torch")
    model = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2)}
    optim = {"state": {"a": {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 0.1, "params": ["a"]}]}
    d = C.digest_full(model, optim, 5, _extra())
    assert set(d) == set(C.DIGEST_COMPONENTS)
    assert d == C.digest_full(dict(reversed(model.items())), optim, 5, _extra())
    moved = C.digest_full(model, optim, 5, _extra(position=12))
    assert {k for k in d if d[k] != moved[k]} == {"data"}
    assert C.digest_full(model, optim, 6, _extra())["step"] != d["step"]
    model["b"] = model["b"] + 1e-7
    assert C.digest_full(model, optim, 5, _extra())["model"] != d["model"]


# -- checkpoint directories --------------------------------------------------------------------
def _fake_checkpoint(path: Path) -> None:
    path.mkdir(parents=True)
    (path / ".metadata").write_bytes(b"m")
    (path / C.EXTRA_FILE).write_bytes(b"e")


def test_only_committed_checkpoints_count_and_old_ones_are_pruned(tmp_path):
    store = C.CheckpointStore(tmp_path / "ckpt", keep=2)
    assert store.latest() is None
    for step in (4, 9):
        _fake_checkpoint(store.path(step))
    staging = store.staging(14, "gen1")
    _fake_checkpoint(staging)                                   # written, not committed
    (store.root / "step-00000019").mkdir()                      # no metadata: a torn save
    assert store.committed() == [4, 9]
    store.commit(staging, 14)
    assert store.committed() == [9, 14] and not staging.exists()
    _fake_checkpoint(store.staging(19, "gen2"))
    store.clean_staging()
    assert not list(store.root.glob(".tmp-*"))


# -- emergency snapshots -----------------------------------------------------------------------
def _fsdp_chunks(t, n):
    """FSDP2's dim-0 sharding: torch.chunk, padded with empty shards."""
    torch = pytest.importorskip("torch")
    chunks = list(torch.chunk(t, n, dim=0))
    return chunks + [t[0:0]] * (n - len(chunks))


def _write_replica(root, gen_id, replica, model, optim, step, num_shards, skip=(), step_of=None):
    for shard in range(num_shards):
        if shard in skip:
            continue
        C.write_emergency(root, f"{gen_id}-p{replica}-s{shard}", {
            "gen_id": gen_id, "step": (step_of or {}).get(shard, step), "replica": replica,
            "shard": shard, "num_replicas": 2, "num_shards": num_shards, "world_size": 2 * num_shards,
            "model": {k: _fsdp_chunks(v, num_shards)[shard] for k, v in model.items()},
            "optim": {"state": {k: {"step": st["step"],
                                    "exp_avg": _fsdp_chunks(st["exp_avg"], num_shards)[shard]}
                                for k, st in optim.items()},
                      "sharded": {k: ["exp_avg"] for k in optim}},
            "extra": {"data": {"epoch": 0, "position": 12 * (step + 1)}},
            "param_groups": [{"lr": 0.1, "params": list(model)}]})


def _state():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    model = {"w": torch.randn(5, 3, generator=g), "b": torch.randn(3, generator=g)}  # uneven shards
    optim = {k: {"step": torch.tensor(6.0), "exp_avg": torch.randn(v.shape, generator=g)}
             for k, v in model.items()}
    return model, optim


def _check_rebuilt(full, model, optim):
    torch = pytest.importorskip("torch")
    for k in model:
        assert torch.equal(full["model"][k], model[k])
        assert torch.equal(full["optim"]["state"][k]["exp_avg"], optim[k]["exp_avg"])
        assert full["optim"]["state"][k]["step"] == 6
    assert full["optim"]["param_groups"] == [{"lr": 0.1, "params": ["w", "b"]}]


def test_full_state_is_rebuilt_from_one_complete_replica(tmp_path):
    model, optim = _state()
    _write_replica(tmp_path, "g0", 0, model, optim, step=5, num_shards=4, skip={1})  # lost a rank
    _write_replica(tmp_path, "g0", 1, model, optim, step=5, num_shards=4)
    headers = C.read_emergency_headers(tmp_path)
    assert len(headers) == 7
    step, paths = C.choose_emergency(headers)
    assert step == 5 and [Path(p).name for p in paths] == \
        ["g0-p0-s0.pt", "g0-p1-s1.pt", "g0-p0-s2.pt", "g0-p0-s3.pt"]
    full = C.rebuild_full_state(paths)
    assert full["step"] == 5 and full["extra"]["data"]["position"] == 72
    _check_rebuilt(full, model, optim)


def test_shards_of_the_same_step_combine_across_replicas(tmp_path):
    """A peer died inside a collective that only some survivors completed: mixed steps."""
    model, optim = _state()
    _write_replica(tmp_path, "g0", 0, model, optim, step=5, num_shards=2, skip={1})
    _write_replica(tmp_path, "g0", 1, model, optim, step=4, num_shards=2, step_of={1: 5})
    step, paths = C.choose_emergency(C.read_emergency_headers(tmp_path))
    assert step == 5 and [Path(p).name for p in paths] == ["g0-p0-s0.pt", "g0-p1-s1.pt"]
    _check_rebuilt(C.rebuild_full_state(paths), model, optim)


def test_incomplete_states_are_never_chosen(tmp_path):
    torch = pytest.importorskip("torch")
    model = {"w": torch.ones(4, 2)}
    optim = {"w": {"step": torch.tensor(1.0), "exp_avg": torch.zeros(4, 2)}}
    _write_replica(tmp_path, "g0", 0, model, optim, step=5, num_shards=2, skip={0})
    _write_replica(tmp_path, "g0", 1, model, optim, step=5, num_shards=2, skip={0})
    _write_replica(tmp_path, "g0", 1, model, optim, step=4, num_shards=2, skip={1})
    _write_replica(tmp_path, "g1", 0, model, optim, step=5, num_shards=2, skip={1})  # other gen
    _write_replica(tmp_path, "g2", 0, model, optim, step=-1, num_shards=2)  # died before a step
    (tmp_path / C.EMERGENCY_DIR / "torn.json").write_text('{"gen_id": "g9", "st')  # torn header
    (tmp_path / C.EMERGENCY_DIR / "nopt.json").write_text(  # a header whose tensors are missing
        '{"gen_id": "g9", "step": 9, "replica": 0, "shard": 0, "num_replicas": 1, "num_shards": 1}')
    assert C.choose_emergency(C.read_emergency_headers(tmp_path)) is None
    _write_replica(tmp_path, "g3", 0, model, optim, step=3, num_shards=2)
    _write_replica(tmp_path, "g4", 1, model, optim, step=8, num_shards=1)
    step, paths = C.choose_emergency(C.read_emergency_headers(tmp_path))
    assert step == 8 and len(paths) == 1 and "g4-" in paths[0]
    C.remove_emergency(paths[0])
    assert C.choose_emergency(C.read_emergency_headers(tmp_path))[0] == 3


def test_local_shards_clone_plain_tensors_and_name_param_groups():
    torch = pytest.importorskip("torch")
    lin = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(lin.parameters(), lr=0.1)
    lin(torch.ones(1, 3)).sum().backward()
    opt.step()
    named = list(lin.named_parameters())
    model, optim = C.local_shards(named, opt)
    assert torch.equal(model["weight"], lin.weight) and model["weight"].data_ptr() != lin.weight.data_ptr()
    assert set(optim["state"]["bias"]) == {"step", "exp_avg", "exp_avg_sq"}
    assert optim["sharded"]["bias"] == []  # plain tensors: nothing to concatenate
    groups = C.param_groups_by_fqn(opt, {id(p): n for n, p in named})
    assert groups[0]["params"] == ["weight", "bias"] and groups[0]["lr"] == 0.1
