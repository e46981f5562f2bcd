"""GPU paths (NCCL, a CUDA device per rank). Skipped with a reason on CPU machines; run them with
scripts/gpu_check.sh on a GPU runner."""
import pytest

from pytest_reshard import chaos

pytestmark = pytest.mark.reshard(steps=10, timeout=300, backend="nccl")


@pytest.mark.gpu(1)
def test_lm_on_nccl_survives_preemption(reshard_run):
    result = reshard_run("lm", world_size=1, faults=[chaos.preempt(at_step=4, grace_s=60)])
    result.assert_ok()


@pytest.mark.gpu(2)
def test_lm_on_nccl_reshards_2_to_1(reshard_run):
    result = reshard_run("lm", world_size=2, faults=[chaos.shift_shards(to_world_size=1, at_step=4, notice_s=60)])
    result.assert_ok()


@pytest.mark.gpu(1)
def test_dflash_on_a_gpu_survives_a_target_kill(reshard_run):
    """Three targets share the GPU with the drafter, whose draft head trains on CUDA."""
    result = reshard_run("dflash", world_size=4, roles={"target": 3, "drafter": 1},
                         faults=[chaos.kill(role="target", at_step=4, phase="send")])
    result.assert_ok()


@pytest.mark.gpu(1)
def test_allocator_fragmentation_reads_the_real_caching_allocator():
    """Free every other 4 MB block: the free memory is split, so 1 - largest / total > 0."""
    import torch

    from pytest_reshard import telemetry

    blocks = [torch.empty(4 * 2**20, dtype=torch.uint8, device="cuda") for _ in range(20)]
    del blocks[::2]
    f = telemetry.allocator_fragmentation()
    assert f is not None and f["total_free"] >= 10 * 4 * 2**20
    assert f["largest_free"] < f["total_free"] and 0 < f["fragmentation"] < 1
    s = telemetry.sample()
    assert s.source == "nvml" and s.memory_total and s.memory_used, s.note


@pytest.mark.gpu(1)
def test_the_ranks_own_gpus_are_their_device_classes(reshard_run):
    """``devices="gpu"``: each rank's class is read from the GPU it computes on; nothing slows it."""
    import torch

    from pytest_reshard.contract import OWN_GPUS
    from pytest_reshard.supervisor.devices import class_of

    result = reshard_run("dflash", world_size=4, roles={"target": 3, "drafter": 1}, devices="gpu",
                         args=["--shares", "measured"],
                         faults=[chaos.kill(role="target", at_step=4, phase="send")])
    result.assert_ok()
    mine = class_of(torch.cuda.get_device_name(0))
    for gen, d in result.history.devices().items():
        assert d.mode == OWN_GPUS and d.classes == (mine,) * len(d.classes), (gen, d)
        assert d.why.startswith("each rank's own GPU: rank 0 "), d.why
