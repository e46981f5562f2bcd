from findings import Finding
from pytest_reshard import chaos

FINDING = Finding(
    title="litgpt pretrain: the CycleIterator built after a mid-epoch resume replays the "
          "restored tail of the data every epoch, and counts epochs from 0 again",
    upstream="Lightning-AI/litgpt#1712 (open); the tail: Lightning-AI/litData#316 (PR #330)",
    affected="litgpt pretrain since the stateful loader resume (0.4.x, reported at 1d37f9a, "
             "Sep 2024) with a litdata whose StreamingDataLoader re-applies its restored state "
             "at every new iterator (before the litData#316 fix); the epoch counter reset: "
             "litgpt to date",
    fixed="the tail: litdata's fix of #316 (the restored state used once; litgpt#2313 says the "
          "litdata==0.2.59 pin restores the cursor correctly); the epoch: open, litgpt PR #2313 "
          "(CycleIterator's epoch saved and restored). --fixed does both",
    reproduced_with="the mechanism: litgpt and litdata are not installed; the script copies "
                    "litgpt's CycleIterator (litgpt.utils) and builds it after the load as "
                    "pretrain.py does, over a stand-in for litdata's StreamingDataLoader whose "
                    "restored state is re-applied at every iter() (litData#316); 2 gloo ranks, "
                    "torch 2.13.0",
    checker="exactly_once_samples",
    message="(epoch 0) consumed twice",
    faults=lambda: [chaos.kill(rank=1, at_step=7, phase="backward")],
    steps=12,
    notes="16 samples, 4 steps an epoch, a save every 3 steps: the kill at step 7 resumes from "
          "the save after step 5 (batch 2 of epoch 1). The CycleIterator starts at epoch 0 and "
          "yields the tail of epoch 1 as epoch 0's, then every new iterator resumes at batch 2 "
          "again: samples 8-15 come back each epoch and 0-7 never (exactly_once_samples fails; "
          "state_equivalence fails on the data digest, the CycleIterator's epoch; "
          "loss_continuity at step 8). The harness needed nothing new; it proves nothing about "
          "litdata's real sharding or shuffling, which the stand-in leaves out.",
)
