from findings import Finding
from pytest_reshard import chaos

FINDING = Finding(
    title="Lightning with max_steps resumes an end-of-epoch checkpoint inside the finished "
          "epoch: one batch too many in it, one too few in the next",
    upstream="Lightning-AI/pytorch-lightning#19617",
    affected="lightning since #12821 (2022, the 1.6 series: FitLoop.restarting is set whenever "
             "max_steps is, epoch finished or not) to 2.6.6 (checked)",
    fixed="open; workaround (--fixed): the same length as max_epochs, with which a checkpoint "
          "written at an epoch's end resumes at the next epoch",
    reproduced_with="the real library: lightning 2.6.6 (strategy='ddp', 2 gloo ranks, "
                    "ReshardCallback)",
    checker="exactly_once_samples",
    message="(epoch 0) consumed twice",
    faults=lambda: [chaos.kill(rank=1, at_step=3, phase="backward")],
    world_size=2,
    steps=4,
    notes="16 samples, 2 steps an epoch, max_steps=4, a checkpoint at each epoch's end: the "
          "kill in step 3 resumes from the end of epoch 0 (step 1). Lightning restarts inside "
          "epoch 0 and runs a third batch of it (current_epoch 0, batch_idx 2) from a new "
          "iterator; its DistributedSampler is already at epoch 1, so that batch is epoch 1's "
          "first, counted in epoch 0, and epoch 1 then trains one batch in epoch 2's order. "
          "exactly_once_samples counts the samples by Lightning's epoch: 8 of epoch 0 twice. "
          "loss_continuity fails at step 3 (step 2's batch happens to be the clean run's). "
          "#19617 reports the case where max_steps itself ends at the epoch's end; the kill "
          "after an end-of-epoch save is the same restart. What the harness lacked: "
          "state_equivalence passes, because the adapter derives the loaded data position from "
          "global_step and the epoch length (epoch 1, batch 0), not from the loop Lightning "
          "restored (epoch 0, batch 2). The loader seeds its epochs from a generator of its "
          "own, so training draws nothing from the global RNG, which a .ckpt does not hold "
          "(findings/lightning_checkpoint_holds_no_rng).",
)
