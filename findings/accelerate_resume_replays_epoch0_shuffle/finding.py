from findings import Finding
from pytest_reshard import chaos

FINDING = Finding(
    title="Accelerate's save_state keeps no shuffle generator: a mid-epoch resume in epoch 1 "
          "finishes it in epoch 0's order (and saving the live generator, as #4232 did, skips "
          "into a permutation never trained on)",
    upstream="huggingface/accelerate#3242 (open); #4233 (closed unmerged, on #4232)",
    affected="accelerate 1.1.1 (reported) to 1.15.0 (reproduced here), more than one process, "
             "the default sampler (use_seedable_sampler=False)",
    fixed="open: no release saves the sampler's generator (#4232/#4233, which would, were "
          "closed unmerged). Workaround (--fixed): register the generator for checkpointing "
          "with the state it had when the epoch's permutation was drawn (#4233's rule)",
    reproduced_with="the real library: accelerate 1.15.0's prepare, save_state, load_state and "
                    "skip_first_batches, 2 gloo ranks, on torch 2.13.0",
    checker="exactly_once_samples",
    message="(epoch 1) consumed twice",
    faults=lambda: [chaos.kill(rank=1, at_step=6, phase="backward")],
    steps=10,
    notes="16 samples, 4 steps an epoch, a save every 3 steps: the kill at step 6 (batch 2 of "
          "epoch 1) resumes from the save after step 5. prepare seeds the RandomSampler's own "
          "generator from the global RNG, which set_seed makes the same in every generation; "
          "load_state restores the global RNG but not that generator, so the rest of epoch 1 "
          "comes in epoch 0's order, and every later epoch one epoch behind (loss_continuity "
          "fails too). A resume inside epoch 0 is right by luck, and so is every resume with "
          "use_seedable_sampler=True (set_epoch reseeds it; see "
          "findings/accelerate_skip_first_batches_resets_epoch). #4233's claim is about the "
          "generator once it is saved: mid-epoch it has drawn this epoch's permutation (with "
          "torch's RandomSampler, not yet the epoch's trailing draw, so it is not even the next "
          "epoch's); --live-generator saves it so and fails exactly_once_samples as well. At one "
          "process prepare makes no generator: the sampler seeds itself from the global RNG, "
          "which save_state does save, mid-epoch after that draw, so a resume in epoch k trains "
          "epoch k+1's order (checked on 1.15.0): #4233's description, literally. At a resume "
          "on an epoch boundary a whole epoch comes in the wrong order, each sample once: only "
          "loss_continuity sees that (no checker compares the data order with the clean run's). "
          "The adapter's run.step took no epoch for the samples; it does now "
          "(run.step(step, batch, epoch=...)).",
)
