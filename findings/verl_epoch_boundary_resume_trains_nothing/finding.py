from findings import Finding
from pytest_reshard import chaos

FINDING = Finding(
    title="verl resumes an epoch-boundary checkpoint into an exhausted data loader: 0 steps "
          "trained, exit 0",
    upstream="verl-project/verl#5725",
    affected="verl's PPO trainer (RayPPOTrainer.fit) before #5725 (merged 2026-03); the SFT "
             "path (CheckpointHandler) still has it (verl-project/verl#7401, open PRs #7402, "
             "#7974)",
    fixed="verl-project/verl#5725 (PPO trainer): _load_checkpoint skips the data loader's "
          "load_state_dict when global_steps % steps_per_epoch == 0 (--fixed)",
    reproduced_with="the mechanism, on the real data loader: verl is not installed; the script "
                    "does fit()'s step/epoch arithmetic (1-based global_steps, a save inside the "
                    "batch loop, current_epoch = global_steps // steps_per_epoch) with torchdata "
                    "0.11.0's StatefulDataLoader, whose state saved after an epoch's last batch "
                    "skips the whole next epoch; 2 gloo ranks",
    checker="liveness",
    message="exited early",
    faults=lambda: [chaos.kill(rank=1, at_step=5, phase="backward")],
    steps=8,
    notes="16 samples, 4 steps an epoch, 2 epochs, save_freq 4: the kill at step 5 (epoch 1) "
          "resumes from global_step_4, the epoch boundary. The resumed generation starts epoch 1, "
          "its loader yields nothing, both ranks close and exit 0 with steps 4-7 never run; "
          "liveness fails: rank 1 exited early (exit code 0) before its first step, and the "
          "target step 7 never committed. loss_continuity and exactly_once_samples say unknown "
          "(steps 4-7 never ran), state_equivalence passes (model and optimizer restored). The harness needed "
          "nothing new: a clean exit before the scenario's last step is a failure.",
)
