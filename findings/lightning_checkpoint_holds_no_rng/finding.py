from findings import Finding
from pytest_reshard import chaos

FINDING = Finding(
    title="A Lightning checkpoint holds no random state: a resumed job draws other dropout "
          "masks than the run it resumes",
    upstream="Lightning-AI/pytorch-lightning#17543",
    affected="lightning 2.x (checked on 2.6.6): a .ckpt holds state_dict, optimizer_states, "
             "lr_schedulers, loops, callbacks, epoch, global_step and the version, as the "
             "'Contents of a checkpoint' docs list, and no Python, NumPy or torch RNG state",
    fixed="open: #17543 (a resume does not reproduce the uninterrupted run's weights) was "
          "labelled won't fix and closed by #19361, which saves stateful loaders' state, not "
          "the RNG. Workaround (--fixed): a callback that writes every rank's RNG states into "
          "the checkpoint in on_save_checkpoint and sets this rank's back in on_load_checkpoint",
    reproduced_with="the real library: lightning 2.6.6 (strategy='ddp', 2 gloo ranks, "
                    "ReshardCallback), dropout 0.2",
    checker="state_equivalence",
    message="rng state differs after the load",
    faults=lambda: [chaos.kill(rank=1, at_step=3, phase="backward")],
    world_size=2,
    steps=4,
    notes="16 samples, 2 steps an epoch, a checkpoint at each epoch's end: the kill in step 3 "
          "resumes from the end of epoch 0 (step 1). Each rank's RNG is then where "
          "seed_everything and the model's init left it, not where the saved run was: "
          "state_equivalence fails on rng (per rank), loss_continuity at the resume point. With "
          "the callback the resumed losses are bit-identical to the clean run's. What the "
          "harness lacked: the adapter takes its load digests at on_train_start, recorded as "
          "'restore, before the data iterator', but Lightning 2.6.6 builds the iterator before "
          "that hook (FitLoop.setup_data), and a DataLoader draws its per-epoch base seed from "
          "the global torch RNG there; with a plain loader the correct fix (identical losses) "
          "still failed state_equivalence on rng. Hence the script's loader has a generator of "
          "its own, in both paths. Rank 0 alone writes the file, so the callback gathers every "
          "rank's state; here every rank is seeded alike, so the run does not show a rank "
          "getting another rank's stream. Not shown: a resume at another world size (the "
          "callback then restores nothing). #17543 reports the symptom (a resumed run's weights "
          "differ from the uninterrupted run's); no Lightning issue found names the missing RNG "
          "state itself (searched: RNG/random state in the checkpoint, seed and dropout after a "
          "resume, reproducible resume).",
)
