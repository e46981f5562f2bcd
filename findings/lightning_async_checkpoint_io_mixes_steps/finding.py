from findings import Finding
from pytest_reshard import chaos

FINDING = Finding(
    title="Lightning's AsyncCheckpointIO writes live tensors: a checkpoint holds a later step's "
          "weights and Adam state under the saved step's counters",
    upstream="Lightning-AI/pytorch-lightning#20953 (fixed by #21079)",
    affected="lightning 1.7 (AsyncCheckpointIO, #13658) to 2.5.3",
    fixed="lightning 2.5.4 (#21079: every tensor of the checkpoint cloned on the caller's "
          "thread before the submit); --fixed is the installed 2.6.6 class",
    reproduced_with="the real library with the pre-fix code put back: lightning 2.6.6's "
                    "Trainer, ModelCheckpoint and AsyncCheckpointIO, whose save_checkpoint is "
                    "replaced in the script by 2.5.3's (the dict submitted uncloned); 2 gloo "
                    "DDP ranks, torch 2.13.0. The storage is made slower than a step by a gate "
                    "of events (the write waits for the next optimizer step), not by timing",
    checker="one_step_checkpoint",
    message="mixes steps: loop and lr_scheduler of step 7; model of step 8",
    faults=lambda: [chaos.kill(rank=1, at_step=9, phase="backward")],
    steps=12,
    notes="4 steps an epoch, ModelCheckpoint(save_last=True, every_n_epochs=1): the save after "
          "step 7 is written during step 8's end, after its optimizer step, so last.ckpt holds "
          "step 8's weights and Adam moments with the loops, the LR schedule and the param "
          "groups' lr of step 7 (plain Python values, copied when the dict is built). The kill "
          "at step 9 resumes from it. The callback's state_each_step=True records the live "
          "state after every step, so one_step_checkpoint names each component's step: "
          "'the checkpoint of step 7 ... mixes steps: loop and lr_scheduler of step 7; model "
          "of step 8 ...; optimizer matched no step's live state' (its moments are of step 8, "
          "its lr of step 7). state_equivalence and loss_continuity fail too. Without a slow "
          "storage the race is real but rare on a tiny CPU model (the write usually wins), "
          "which is why the gate. What the harness lacked: the live state of each step (added "
          "for this entry: run.state_after, one_step_checkpoint), and a save that completes "
          "later: the adapter records a save when Trainer.save_checkpoint returns and the file "
          "exists, so with an asynchronous writer the first save goes unrecorded and later ones "
          "are recorded while the file still holds the previous save (why the kill is at step "
          "9). The --fixed side found a false alarm in the adapter: Lightning builds the data "
          "iterator, whose iter() draws from torch's RNG, before on_train_start, where the "
          "adapter took its RNG digest; it now takes it at on_fit_start. The script saves and "
          "restores the RNG states itself (a .ckpt holds none, a separate finding), both ways.",
)
