"""Unit tests of the LM's uneven shares (``--shares measured``): the pure parts, no processes."""
from __future__ import annotations

import pytest

from pytest_reshard.fixtures import _common as C
from pytest_reshard.fixtures import lm


def test_shares_follow_the_speeds_sum_to_the_batch_and_give_every_rank_one():
    assert C.proportional_shares([1.0, 0.32, 0.32], 12) == [7, 3, 2]   # 7.3, 2.3, 2.3
    assert C.proportional_shares([1.0, 1.0, 0.4, 0.4], 12) == [4, 4, 2, 2]
    assert C.proportional_shares([100.0, 1.0, 1.0], 12) == [10, 1, 1]   # at least one each
    assert C.proportional_shares([1.0] * 5, 12) == [3, 3, 2, 2, 2]       # ties: lower rank first
    for speeds in ([3.0, 1.0, 7.0], [1e-3, 1.0, 1.0, 1.0], [2.0, 2.0, 2.0, 1.0]):
        counts = C.proportional_shares(speeds, 12)
        assert sum(counts) == 12 and min(counts) >= 1, (speeds, counts)


def test_shares_refuse_what_cannot_be_split():
    with pytest.raises(ValueError, match="cannot give each of 5 ranks a sample"):
        C.proportional_shares([1.0] * 5, 4)
    with pytest.raises(ValueError, match="positive and finite"):
        C.proportional_shares([1.0, 0.0], 12)


def test_measured_shares_are_even_within_the_noise_band_and_proportional_beyond():
    assert C.measured_shares([0.020, 0.024, 0.019, 0.021], 12) == [3, 3, 3, 3]
    assert C.measured_shares([0.06, 0.20, 0.21], 12) == [8, 2, 2]
    # just past the band: proportional, not even
    assert C.measured_shares([0.10, 0.10 * C.EVEN_WITHIN * 1.01], 12) == [7, 5]
    assert C.measured_shares([0.02] * 5, 12) == [3, 3, 2, 2, 2]   # 12 is not a multiple of 5


def test_slices_of_measured_shares_partition_the_global_batch_in_rank_order():
    ids = list(range(100, 112))
    counts = [8, 2, 2]
    slices = [C.share_slice(ids, r, counts) for r in range(3)]
    assert slices == [ids[:8], ids[8:10], ids[10:]]
    assert C.share_slice(ids, 1, [3, 3, 3, 3]) == C.rank_slice(ids, 1, 4)   # even: as before
    with pytest.raises(ValueError, match="sum to 11, not to the global batch of 12"):
        C.share_slice(ids, 0, [8, 2, 1])


def test_stale_shares_of_the_previous_mix_overlap_the_new_ones():
    """The planted ``stale_shares``: rank 1 slices with the last generation's shares."""
    ids = list(range(12))
    new = [3, 3, 3, 3]
    drawn = [C.share_slice(ids, r, [8, 2, 2] if r == 1 else new) for r in range(4)]
    flat = [i for d in drawn for i in d]
    assert len(flat) != len(set(flat)) and set(flat) != set(ids)   # duplicated and lost


def test_time_kernel_measures_a_positive_time_without_a_cgroup():
    assert C.time_kernel(iters=5, reps=1) > 0


def test_the_lm_takes_shares_and_its_share_bugs_need_measured_shares():
    assert lm.parse_args([]).shares == "even"
    assert lm.parse_args(["--shares", "measured", "--bug", "stale_shares"]).bug == "stale_shares"
    assert {"unweighted_shares", "stale_shares"} <= set(lm.BUGS)
    with pytest.raises(SystemExit, match="add --shares measured"):
        lm.parse_args(["--bug", "unweighted_shares"])


def test_share_feedback_settles_where_every_rank_computes_equally_long():
    """Ranks of speeds 1 and 0.25 with a fixed cost per step (2 sample-times): a kernel's
    proportional split (38/10) leaves the fast rank idle 17% of each step; the feedback reaches
    equal times within a sample's time, from any start."""
    def seconds(counts: list[int]) -> list[float]:
        return [(2 + n) / speed for n, speed in zip(counts, [1.0, 0.25])]

    for counts in ([38, 10], [24, 24], [47, 1]):
        feedback = C.ShareController(48)
        for _ in range(12):
            counts = feedback.update(counts, seconds(counts)) or counts
        fast, slow = seconds(counts)
        assert sum(counts) == 48 and abs(fast - slow) <= 1 / 0.25, (counts, fast, slow)


def test_share_feedback_without_a_rank_time_changes_nothing_and_rejects_a_foreign_step():
    feedback = C.ShareController(12)
    assert feedback.update([9, 3], [0.1, 0.0]) is None and feedback.rates is None
    assert feedback.update([9, 3], [0.1, 0.1]) == [9, 3]
    with pytest.raises(ValueError, match="do not describe one step of 12 samples"):
        feedback.update([9, 4], [0.1, 0.1])
