"""The bundled LM on mixed devices (``devices=``, CPU caps by cgroup): with ``--shares measured``
each generation times its ranks and splits the global batch in proportion to their speeds,
weighting each rank's loss by its share; a change of the device mix measures again. Each planted
mistake of uneven shares is caught by the checker meant to catch it."""
import re

import pytest

from pytest_reshard import chaos
from pytest_reshard.fixtures.lm import SHARES_NOTE

from .test_devices import CGROUPS   # skips, with the reason, where cgroups cannot cap a rank

#: One H100-class rank and two A100-class ones (0.32 of an H100): shares about 8, 2, 2 of the 12.
MIX = {"h100": 1, "a100": 2}
#: After step 5 the job moves to four L40S-class ranks: even shares again, 3 each.
CHANGE = [chaos.change_devices(devices={"l40s": 4}, at_step=5)]
MEASURED = ["--shares", "measured"]



pytestmark = [CGROUPS, pytest.mark.reshard(world_size=3, steps=12, timeout=300)]


def _shares(result) -> dict[int, dict[int, set[int]]]:
    """gen -> rank -> the sizes of its slices over the generation's kept steps."""
    out: dict[int, dict[int, set[int]]] = {}
    for occ in result.history.kept():
        for rank, pairs in result.history.samples(occ.gen, occ.step).items():
            out.setdefault(occ.gen, {}).setdefault(rank, set()).add(len(pairs))
    return out


@pytest.mark.nightly   # 45 s and two cgroup-capped clean runs: the CI budget (unit: test_lm_shares)
def test_measured_shares_follow_each_device_mix_and_pass_every_checker(reshard_run):
    result = reshard_run("lm", devices=MIX, throttle="cgroup", args=MEASURED, faults=CHANGE)
    shares = _shares(result)
    noted = {n.gen: n.fields["counts"] for n in result.history.notes(SHARES_NOTE)}
    print(f"measured shares per generation: {noted}")
    assert sorted(shares) == [0, 1] and sorted(noted) == [0, 1]
    for gen, counts in noted.items():   # every kept step used the generation's shares
        assert shares[gen] == {r: {n} for r, n in enumerate(counts)}, (gen, shares[gen], counts)
        assert sum(counts) == 12
    assert noted[0][0] > 2 * max(noted[0][1:]), noted   # the H100-class rank: most of the batch
    assert len(noted[1]) == 4 and noted[1] != noted[0], noted    # measured anew after the change
    others = {c: v for c, v in result.verdicts.items() if v.status != "pass"}
    assert set(others) <= {"balance"}, {c: v.message for c, v in others.items()}
    # FSDP2 interleaves its collectives with the compute: the LM cannot time them apart
    balance = result.verdicts["balance"]
    assert balance.status == "unknown" and "recorded no compute_s= and wait_s=" in \
        balance.message, balance.message
    print(result.verdicts["loss_continuity"].message)


@pytest.mark.nightly   # unit: test_loss_fidelity's device-mix window
def test_unweighted_shares_fail_loss_continuity_against_the_even_share_run(reshard_run):
    """No fault is needed: in a device mix generation 0 is no repeat of the clean (even-share)
    run, so its difference is not taken for the workload's own nondeterminism."""
    result = reshard_run("lm", devices=MIX, throttle="cgroup", steps=6,
                         args=[*MEASURED, "--bug", "unweighted_shares"])
    v = result.verdicts["loss_continuity"]
    assert v.status == "fail", v.message
    assert v.generation == 0 and v.step is not None and v.step < 6, v
    assert re.search(rf"departs from the reference at step {v.step}\b", v.message), v.message
    assert v.replay and "pytest" in v.replay


@pytest.mark.nightly   # exactly_once_samples' planted bugs in CI: tests/scenarios/test_lm.py
def test_stale_shares_on_one_rank_fail_exactly_once_naming_the_step_and_ranks(reshard_run):
    result = reshard_run("lm", devices=MIX, throttle="cgroup", faults=CHANGE,
                         args=[*MEASURED, "--bug", "stale_shares"])
    v = result.verdicts["exactly_once_samples"]
    assert v.status == "fail", v.message
    resumed = result.history.generations[1].resume_step
    assert (v.step, v.generation) == (resumed, 1), v
    pair = re.search(rf"at step {resumed} \(generation 1, rank (\d)\) and at step {resumed} "
                     rf"\(generation 1, rank (\d)\); two ranks of one step drew it", v.message)
    assert pair and "1" in pair.groups() and v.rank == int(pair[2]), v.message
