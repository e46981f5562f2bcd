from findings import Finding
from pytest_reshard import chaos

FINDING = Finding(
    title="Trainer resumes from a checkpoint that lacks a rank's RNG file: the rank keeps its "
          "seeded RNG, and only an INFO line says so",
    upstream="unreported: huggingface/transformers (the skip dates from PR #14994, for #14554; "
             "the same INFO-only skip in Accelerate: huggingface/accelerate#4283, open)",
    affected="transformers 5.24.0 (Trainer._load_rng_state: a missing rng_state_{rank}.pth is "
             "logged at INFO and skipped, since 4.x)",
    fixed="open. Workaround (--fixed): resume from the newest checkpoint that holds every "
          "rank's rng_state_{rank}.pth and trainer_state.json",
    reproduced_with="the real library: transformers 5.24.0's Trainer, get_last_checkpoint and "
                    "_load_rng_state, 2 gloo ranks on torch 2.13.0, dropout 0.1, rank 1 "
                    "SIGKILLed as its part of the checkpoint-4 save starts",
    checker="state_equivalence",
    message="but rank 1 never saved its rng for step 3",
    faults=lambda: [chaos.kill_during_save(at_step=3, boundary="start", rank=1)],
    world_size=2,
    steps=6,
    notes="A save every 2 steps; rank 1 dies at the start of the checkpoint-4 save, after its "
          "one collective (store_flos), so rank 0 writes the whole folder but "
          "rng_state_1.pth. get_last_checkpoint takes it; rank 1 restores model, optimizer, "
          "scheduler and data position from it and keeps the RNG it was seeded with "
          "(loss_continuity fails too: a loss spike at the resume). The harness knows rank 1 "
          "never recorded its save of step 3 and that its load recorded an RNG digest anyway. "
          "Searched the transformers issues for the INFO message ('Didn't find an RNG file for "
          "process'), a missing per-rank RNG file, and a partial save's RNG: only #14554/#14994 "
          "(the skip was added so that fewer GPUs could resume), #17032 (epoch saves not "
          "reloading the RNG) and accelerate#4283/#4308 (the same skip in Accelerate, a WARNING "
          "proposed). Entry hf_resume_takes_incomplete_checkpoint's workaround "
          "(trainer_state.json present) does not catch this folder: rank 0 wrote that file. "
          "What it does not prove: the RNG changes only the dropout masks here; a resume that "
          "draws nothing random after it would lose nothing. With the fix every checker passes.",
)
