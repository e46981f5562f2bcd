"""Checkpoint profiles and the checkpoint_factory: real DCP saves, resharded loads, bit-exact.

The pure parts (profiles, scaling, the content pattern, the row split) are checked without
processes; the rest writes real sharded checkpoints with real ranks (gloo) and loads them at
another world size. The planted corruptions prove the bit-exact check can fail.
"""
from __future__ import annotations


import pytest
from pytest_reshard.fixtures.checkpoint_profiles import PROFILES, parse_scale, profile


# -- profiles (pure) ----------------------------------------------------------------------------
@pytest.mark.parametrize("name,params,tensors", [
    ("llama3-8b", 8.030e9, 291), ("llama3-70b", 70.554e9, 723), ("qwen3.6-27b", 26.90e9, 755)])
def test_profiles_have_the_published_sizes(name, params, tensors):
    p = profile(name)
    assert p.parameters() == pytest.approx(params, rel=1e-3)
    assert len(p.tensors()) == tensors
    assert p.nbytes() == 2 * p.parameters() + 2 * sum(  # bf16, A_log in fp32
        t.numel for t in p.tensors() if t.dtype == "float32")


def test_a_scale_keeps_every_tensor_and_shrinks_the_bytes():
    for p in PROFILES.values():
        full, small = p.tensors(), p.tensors(1 / 1024)
        assert [t.name for t in small] == [t.name for t in full]
        assert [len(t.shape) for t in small] == [len(t.shape) for t in full]
        assert p.nbytes(1 / 1024) == pytest.approx(p.nbytes() / 1024, rel=0.1)
    small = profile("llama3-70b").tensors(1 / 1024)
    # sizes a 3-rank Shard(0) cannot split evenly, as in the real model
    assert sum(t.shape[0] % 3 != 0 for t in small) > 700
    # the hybrid profile has tensors smaller than the world size: some ranks hold no rows
    assert min(t.shape[0] for t in profile("qwen3.6-27b").tensors(1 / 4096)) < 3


def test_optimizer_state_adds_two_fp32_moments_per_parameter():
    p = profile("llama3-8b")
    assert p.nbytes(optimizer=True) == p.nbytes() * 5  # bf16 weights + 2 x fp32
    assert len(p.tensors(optimizer=True)) == 3 * len(p.tensors())


@pytest.mark.parametrize("text,value", [("1/1024", 1 / 1024), ("0.5", 0.5), (1, 1.0)])
def test_parse_scale(text, value):
    assert parse_scale(text) == value


@pytest.mark.parametrize("bad", ["0", "2", "-1/4", "1/0x"])
def test_parse_scale_rejects_what_is_not_a_fraction(bad):
    with pytest.raises(ValueError):
        parse_scale(bad)


def test_a_checkpoint_scale_that_is_not_a_fraction_is_a_usage_error(pytester):
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest("--reshard-checkpoint-scale=2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--reshard-checkpoint-scale='2'*(0, 1]*"])


def test_unknown_profile_names_the_choices():
    with pytest.raises(ValueError, match="llama3-70b"):
        profile("llama4")


# -- the content pattern and the row split (pure, torch in-process) ------------------------------
def test_shards_filled_apart_assemble_into_the_full_tensor():
    import torch

    from pytest_reshard.checkpoints.factory import _base_block, _rows, fill

    base = _base_block()
    full = torch.empty(1000, 3, dtype=torch.bfloat16)
    fill(full, "w", 0, base)
    for world in (3, 4, 7):
        parts = []
        for r in range(world):
            start, stop = _rows(1000, world, r)
            part = torch.empty(stop - start, 3, dtype=torch.bfloat16)
            fill(part, "w", start, base)
            parts.append(part)
        assert torch.equal(torch.cat(parts).view(torch.int16), full.view(torch.int16))
    other = torch.empty_like(full)
    fill(other, "v", 0, base)
    assert not torch.equal(other.view(torch.int16), full.view(torch.int16))
    assert len({bytes(full[i].view(torch.uint8).numpy()) for i in range(1000)}) == 1000


@pytest.mark.parametrize("n", [1, 2, 4, 10, 4008, 4009])
@pytest.mark.parametrize("world", [1, 3, 4])
def test_row_split_is_torch_chunk(n, world):
    import torch

    from pytest_reshard.checkpoints.factory import _rows

    sizes = [len(c) for c in torch.arange(n).chunk(world)]
    sizes += [0] * (world - len(sizes))  # chunk returns fewer pieces; DTensor pads with empties
    assert [_rows(n, world, r)[1] - _rows(n, world, r)[0] for r in range(world)] == sizes


