from findings import Finding
from pytest_reshard import chaos

FINDING = Finding(
    title="Trainer resumes with the checkpoint's per-device batch, not its arguments': a resume "
          "at another per-device batch with the same global batch halves the batch and "
          "retrains samples",
    upstream="huggingface/transformers#43708",
    affected="transformers <= 5.1.0 (train() restores _train_batch_size from trainer_state.json "
             "whenever it holds one)",
    fixed="transformers 5.2.0 (huggingface/transformers#43770: restored only with "
          "auto_find_batch_size); the installed 5.24.0 resumes correctly",
    reproduced_with="the mechanism on the real library: transformers 5.24.0's Trainer (4 then 2 "
                    "gloo ranks, hf.instrument) with 5.1.0's two restoring lines done before "
                    "train(), exactly where 5.1.0 ran them; 5.24.0 as installed passes every "
                    "checker (tests/scenarios/test_adapters_hf.py, a constant global batch)",
    checker="exactly_once_samples",
    message="consumed twice",
    faults=lambda: [chaos.shift_shards(to_world_size=2, at_step=3)],
    world_size=4,
    steps=8,
    notes="The report's symptom is max_steps (epoch-based: per-device 1 x accumulation 4 -> "
          "4 x 1 makes 8 steps 32; reproduce.py shows it). Under the harness max_steps is set, "
          "so the run shows the other half: the data loader takes the old per-device batch "
          "(2 x 2 ranks = 4 samples a step, not 8) and the skip of global_step batches per rank "
          "stops at sample 16 of the 32 the 4 ranks consumed. What the harness lacked: its "
          "Trainer adapter derives the data position from the arguments' batch "
          "(per_device_train_batch_size x world size), not from the data loader's, so "
          "state_equivalence's data digest matches and passes; only the recorded sample ids "
          "show it. With the fix every checker passes.",
)
