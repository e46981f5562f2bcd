from findings import Finding
from pytest_reshard import chaos

FINDING = Finding(
    title="Trainer at one process resuming a distributed checkpoint looks only for "
          "rng_state.pth: it ignores rng_state_0.pth and keeps its seeded RNG",
    upstream="unreported: huggingface/transformers (closest: #14554, a resume on fewer GPUs, "
             "whose fix PR #14994 made an RNG that cannot be restored a logged skip)",
    affected="transformers 5.24.0 (Trainer._load_rng_state: world_size 1 reads rng_state.pth "
             "only; a distributed save writes rng_state_{process_index}.pth)",
    fixed="open. Workaround (--fixed): before a one-process resume of a distributed "
          "checkpoint, copy its rng_state_0.pth to rng_state.pth",
    reproduced_with="the real library: transformers 5.24.0's Trainer (2 gloo ranks, then 1 "
                    "process) on torch 2.13.0, DropConnect 0.1 on one weight (reproduce.py: "
                    "dropout 0.1)",
    checker="state_equivalence",
    message="rng state differs after the resharded load of step 3 in generation 1 "
            "(world size 2 -> 1) on rank 0",
    faults=lambda: [chaos.shift_shards(to_world_size=1, at_step=3)],
    world_size=2,
    steps=6,
    notes="The global batch is held at 8 (per-device 8 / world size), so model, optimizer, "
          "schedule and data position all resume right at one process; the RNG does not "
          "(loss_continuity fails too: the masks after the resume are not the clean run's). "
          "The Trainer says so at INFO level alone ('Didn't find an RNG file, if you are "
          "resuming a training that was launched in a distributed fashion, reproducibility is "
          "not guaranteed.'): known behaviour, not a report anyone filed. Searched the "
          "transformers issues for that message, for rng_state.pth with rng_state_0.pth, and "
          "for resuming a multi-GPU checkpoint on one GPU; found #14554/#14994 (the CUDA RNG "
          "of DataParallel on fewer GPUs) and #17032 (epoch saves not reloading the RNG). "
          "Which RNG a shrunk job should take is a choice (the harness expects rank 0's: a "
          "single process continues process 0); the Trainer takes none. The script's "
          "randomness is DropConnect (a parametrization on the MLP's c_fc weight), not "
          "dropout: activation dropout draws per sample, so each rank draws its own masks and "
          "the loss depends on the world size; loss_continuity then says unknown for every "
          "2 -> 1 run, the fixed one too. With no draw at all the bug is harmless and the "
          "harness passes it (checked: the seeded RNG equals the saved one). What the harness "
          "lacked: a loss comparison across world sizes for per-sample dropout. With the fix "
          "every checker passes.",
)
