from findings import Finding
from pytest_reshard import chaos

FINDING = Finding(
    title="torchtitan's TorchFT checkpointer resumes the data loader from a newer step than the "
          "model: a job killed between a step's two saves never trains that step's batch",
    upstream="pytorch/torchtitan#4686",
    affected="torchtitan 0.1.0 to 0.3.0 with TorchFT's data-loader checkpoints (the default "
             "with fault tolerance on): load() runs _ft_load first, which takes the newest "
             "step of the replica's data-loader folder (written every step) before the main "
             "checkpoint's step is chosen; checked in 0.3.0 as installed and on main of "
             "2026-08-22",
    fixed="pytorch/torchtitan#4686 (merged 2026-09-15, after 0.3.0): the data loader's step is "
          "the newest one no later than the main checkpoint's (--fixed: a subclass written from "
          "the PR's description; its diff is newer than the stored torchtitan snapshot)",
    reproduced_with="the real library: torchtitan 0.3.0's TorchFTCheckpointManager, "
                    "TorchFTManager (torchft 0.2.0's Manager, a Lighthouse the script hosts), "
                    "TorchFTOptimizersContainer, LRSchedulersContainer and "
                    "ParallelAwareDataloader in a user's DDP loop: one replica group of 2 gloo "
                    "ranks, torch 2.13.0",
    checker="one_step_checkpoint",
    message="mixes steps: data of step 4; lr_scheduler, model, optimizer and train_state of "
            "step 3",
    faults=lambda: [chaos.kill(rank=0, at_step=4, phase="checkpoint")],
    world_size=2,
    steps=8,
    notes="A checkpoint every step (interval=1). torchtitan's save writes the data loader to "
          "ft-replicat-0/step-N, then the rest to step-N; the script marks the standard "
          "'checkpoint' point where the second begins (its dcp_save, after the first is on "
          "disk), and the kill there at step 4 (torchtitan's step 5) leaves step-4 and "
          "ft-replicat-0/step-5: the restart loads the model of step 3 with the data position "
          "of step 4, and the 4 samples of step 4 are never trained. one_step_checkpoint names "
          "the steps from the live state each rank records after each step (run.state_after); "
          "exactly_once_samples ('4 samples ... were never consumed'), state_equivalence (the "
          "data state loaded is not the one saved with step 3) and loss_continuity fail too. "
          "What the harness lacked: a Finding field for phases, so the brief's own phase "
          "'between_saves' could not be declared (the standard 'checkpoint' point is the same "
          "place); and a launcher of replica groups as separate jobs, which torchtitan's FT "
          "trainer needs, so the script is a loop over its FT components (no adapter). The LR "
          "is constant: TorchFTOptimizersContainer caches its state dict at its start, learning "
          "rates included (pytorch/torchtitan#4598, a bug of its own), and with a schedule the "
          "fixed run restores a stale LR. Not covered: several replica groups, and one group's "
          "restart that heals from a live peer. With the fix every checker passes.",
)
