"""Per-rank memory in the history, and the allocator fragmentation checker, on hand-built
histories (no processes): pass, fail, and unknown where it cannot apply."""
from pytest_reshard import checkers

from ..histories import Builder

MIB = 2**20


def run_with(backend="nccl", allocator=()):
    b = Builder(steps=6, world_size=2)
    b.events[0]["backend"] = backend
    b.gen(run=range(6))
    for gen, rank, step, frag, largest, total in allocator:
        b.rank(gen, rank, "note", what="allocator", step=step, fragmentation=frag,
               largest_free=largest * MIB, total_free=total * MIB, reserved=4096 * MIB,
               free_blocks=7)
    return b


def test_fragmentation_within_the_limit_passes():
    h = run_with(allocator=[(0, 0, 2, 0.05, 950, 1000), (0, 1, 5, 0.12, 880, 1000)]).history()
    v = checkers.allocator_fragmentation(h)
    assert v.status == "pass" and "worst of 2 samples: rank 1 (generation 0, step 5)" in v.message
    assert "12% fragmented" in v.message and "within 30%" in v.message


def test_fragmentation_above_30_percent_fails_naming_rank_step_and_blocks():
    h = run_with(allocator=[(0, 0, 2, 0.05, 950, 1000), (0, 1, 4, 0.42, 580, 1000)]).history()
    v = checkers.allocator_fragmentation(h)
    assert v.status == "fail" and (v.rank, v.generation, v.step) == (1, 0, 4)
    assert v.message.startswith("rank 1 (generation 0, step 4): allocator 42% fragmented, largest "
                                "free block 580 MiB of 1000 MiB free in 7 pieces: above 30%")
    assert checkers.allocator_fragmentation(h, threshold=0.5).status == "pass"


def test_a_few_free_mib_split_in_two_are_not_judged():
    h = run_with(allocator=[(0, 0, 2, 0.5, 10, 20)]).history()
    v = checkers.allocator_fragmentation(h)
    assert v.status == "pass" and "never held more than 20 MiB free" in v.message


def test_on_cpu_fragmentation_is_not_applicable_never_a_pass():
    v = checkers.allocator_fragmentation(run_with(backend="gloo").history())
    assert v.status == "unknown" and "not applicable: the run used no CUDA device (backend " \
        "gloo)" in v.message
    v = checkers.allocator_fragmentation(run_with(backend="nccl").history())
    assert v.status == "unknown" and "telemetry.record_allocator(run)" in v.message


def test_history_keeps_each_ranks_peak_memory_and_headroom():
    b = run_with(backend="gloo")
    b.events[0]["memory_budget_bytes"] = 1024 * MIB
    b.sup("rss", gen=0, rank=0, peak_bytes=300 * MIB, budget_bytes=1024 * MIB)
    b.sup("rss", gen=0, rank=1, peak_bytes=250 * MIB, budget_bytes=1024 * MIB)
    b.sup("rss", gen=1, rank=1, peak_bytes=450 * MIB, budget_bytes=1024 * MIB)  # after a reshard
    b.rank(0, 0, "memory", peak=70 * 2**30, budget=80 * 2**30)   # CUDA peak, device size
    mem = b.history().memory()
    assert mem[1].peak_bytes == 450 * MIB and mem[1].headroom_bytes == 574 * MIB
    assert mem[0].headroom_bytes == 724 * MIB and mem[0].device_headroom_bytes == 10 * 2**30
    assert mem[1].device_peak_bytes is None and mem[1].device_headroom_bytes is None
