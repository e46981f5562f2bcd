"""The upgrade suite: what ``pytest-reshard gate`` runs in each stack, for the numbers it compares.

The bundled LM (tiny, CPU; production-shaped with ``RESHARD_GATE_SIZE=gpt2`` on GPU runners)
under a fixed per-rank memory budget, so memory is judged as headroom: steady training (step
time, throughput, peak memory) and a planned reshard 4 -> 3 (relaunch, checkpoint save and
load). ``RESHARD_GATE_PLANT`` (``--plant``) adds a regression to every generation on purpose.
"""
import os

import pytest

from pytest_reshard import chaos
from pytest_reshard.gate.stacks import PLANT_ENV, parse_plant, planted_faults

pytestmark = pytest.mark.chaos

STEPS = 12
RESHARD_AT = 4  # the reshard scenario's generations: steps 0-4 at 4 ranks, 5-11 at 3
BUDGET = int(os.environ.get("RESHARD_GATE_BUDGET_MB", "2048")) * 2**20
SIZE = os.environ.get("RESHARD_GATE_SIZE", "tiny")
PLANT = parse_plant(os.environ.get(PLANT_ENV, ""))

SCENARIOS = {
    "steady": {"faults": [], "generations": [(0, STEPS)]},
    "reshard-4-to-3": {
        "faults": [chaos.shift_shards(to_world_size=3, at_step=RESHARD_AT, phase="optimizer",
                                   notice_s=10)],
        "generations": [(0, RESHARD_AT + 1), (RESHARD_AT + 1, STEPS - RESHARD_AT - 1)]},
}


@pytest.mark.reshard(world_size=4, steps=STEPS, timeout=300)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_lm_upgrade(reshard_run, name):
    sc = SCENARIOS[name]
    faults = sc["faults"] + planted_faults(PLANT, sc["generations"])
    reshard_run("lm", faults=faults, memory_budget_bytes=BUDGET,
                args=["--size", SIZE, "--ckpt-every", "3"]).assert_ok()
