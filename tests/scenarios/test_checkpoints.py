"""Checkpoint profiles and the checkpoint_factory: real DCP saves, resharded loads, bit-exact.

The pure parts (profiles, scaling, the content pattern, the row split) are checked without
processes; the rest writes real sharded checkpoints with real ranks (gloo) and loads them at
another world size. The planted corruptions prove the bit-exact check can fail.
"""
from __future__ import annotations

import shutil

import pytest
from pytest_reshard.fixtures.checkpoint_profiles import profile


# -- real saves and resharded loads ---------------------------------------------------------------
def test_70b_profile_saves_at_4_and_reshards_to_3_bit_exact(checkpoint_factory):
    written = checkpoint_factory("llama3-70b", scale=1 / 1024, world_size=4)
    assert written.tensors == 723 and len(written.digests) == 723
    assert written.file_bytes >= written.nbytes  # the bytes really are on disk
    loaded = written.load(world_size=3)
    loaded.assert_bit_exact()
    assert loaded.mismatches() == []
    print(f"70B/1024 ({written.nbytes / 1e6:.0f} MB): save {written.save_gbps:.2f} GB/s at 4 "
          f"ranks, load {loaded.load_gbps:.2f} GB/s at 3 (cold)")


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory, _reshard_checkpoint_launcher):
    """The 27B hybrid profile, tiny: 3-D conv weights, fp32 tensors, 4-row tensors that leave a
    rank of 3 empty; written at 2 ranks, with torch.save's zip CRCs (torch's default)."""
    from pytest_reshard.checkpoints.factory import CheckpointFactory

    factory = CheckpointFactory(tmp_path_factory.mktemp("hybrid"), _reshard_checkpoint_launcher,
                                default_scale=1 / 4096)
    return factory("qwen3.6-27b", world_size=2, crc32=True)


def test_hybrid_profile_reshards_2_to_3_with_empty_shards(hybrid):
    hybrid.load(world_size=3).assert_bit_exact()


def test_a_bit_flipped_in_a_loaded_shard_fails_naming_tensor_row_and_rank(hybrid):
    from pytest_reshard.checkpoints.factory import BitExactError

    name = "model.layers.3.self_attn.q_proj.weight"
    loaded = hybrid.load(world_size=3, corrupt=name)
    assert loaded.mismatches() == [name]
    with pytest.raises(BitExactError, match=r"1 of 755 tensors differ") as err:
        loaded.assert_bit_exact()
    n = next(t.shape[0] for t in profile("qwen3.6-27b").tensors(1 / 4096) if t.name == name)
    assert f"1 of {n} rows differ" in str(err.value) and "on rank 2 of 3" in str(err.value)


def test_a_byte_corrupted_on_disk_fails_the_check(hybrid, tmp_path):
    """A bit rotted in a shard file: DCP loads it without complaint, CRC written or not (its
    loader never checks torch.save's CRC32); the digests do not."""
    import torch
    from torch.distributed.checkpoint import FileSystemReader

    from pytest_reshard.checkpoints.factory import (
        BitExactError,
        WrittenCheckpoint,
        _base_block,
        _rows,
        fill,
    )

    copy = tmp_path / "ckpt"
    shutil.copytree(hybrid.path, copy)
    written = WrittenCheckpoint(**{**hybrid.__dict__, "path": copy})
    name = "model.layers.5.mlp.down_proj.weight"
    shape = next(t.shape for t in profile("qwen3.6-27b").tensors(1 / 4096) if t.name == name)
    start, stop = _rows(shape[0], 2, 1)
    shard = torch.empty(stop - start, *shape[1:], dtype=torch.bfloat16)
    fill(shard, name, start, _base_block())
    data = bytes(shard.reshape(-1).view(torch.uint8).numpy())
    # where DCP put rank 1's shard: its record, then the raw bytes inside it
    metadata = FileSystemReader(str(copy)).read_metadata()
    record = next(info for index, info in metadata.storage_data.items()
                  if index.fqn == name and index.offset[0] == start)
    path = copy / record.relative_path
    raw = bytearray(path.read_bytes())
    at = raw.find(data, record.offset, record.offset + record.length)
    assert at >= 0, "the shard's bytes are stored verbatim in its record"
    raw[at + len(data) // 2] ^= 0x01
    path.write_bytes(raw)
    loaded = written.load(world_size=3)
    assert loaded.mismatches() == [name]
    with pytest.raises(BitExactError, match="differ from the pattern"):
        loaded.assert_bit_exact()
