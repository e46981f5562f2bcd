from findings import Finding
from pytest_reshard import chaos

FINDING = Finding(
    title="Accelerate's skip_first_batches resets the epoch: a mid-epoch resume in epoch 1 "
          "finishes it in epoch 0's shuffle order",
    upstream="huggingface/accelerate#4071",
    affected="accelerate up to 1.14.0 (skip_first_batches builds its DataLoaderShard at "
             "iteration 0, so its __iter__ calls set_epoch(0))",
    fixed="accelerate 1.15.0 (#4071: skip_first_batches carries the loader's iteration)",
    reproduced_with="the mechanism, on the real library: accelerate 1.15.0's skip_first_batches "
                    "with the #4071 line reverted in the script (the skipped loader's iteration "
                    "set back to 0, the one difference from 1.14.0's); --fixed keeps 1.15.0's. "
                    "Checked against a real accelerate 1.14.0 install too (PYTHONPATH): the same "
                    "verdict without the revert. 2 gloo ranks, use_seedable_sampler=True",
    checker="exactly_once_samples",
    message="(epoch 1) consumed twice",
    faults=lambda: [chaos.kill(rank=1, at_step=6, phase="backward")],
    steps=10,
    notes="16 samples, 4 steps an epoch, a save every 3 steps: the kill at step 6 (batch 2 of "
          "epoch 1) resumes from the save after step 5. The adapter's run.steps calls "
          "set_epoch(1) and skip_first_batches(loader, 2); the skipped loader sets the "
          "SeedableRandomSampler back to epoch 0, so steps 6-7 train epoch 0's last batches as "
          "epoch 1's: samples of epoch 1 twice and others never (loss_continuity fails too). "
          "Only samplers that shuffle by set_epoch are hit (use_seedable_sampler=True, as the "
          "Trainer sets; a DistributedSampler; a dataset with set_epoch); Accelerate's default "
          "sampler has another bug here (findings/accelerate_resume_replays_epoch0_shuffle). "
          "The harness needed nothing new: the adapter records each sample with its epoch.",
)
