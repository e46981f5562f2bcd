from findings import Finding
from pytest_reshard import chaos

FINDING = Finding(
    title="torchtitan's default last_save_model_only=True: a job restarted after the final save "
          "resumes from the model-only step-N/ as if it were a full checkpoint, and cannot start",
    upstream="unreported: pytorch/torchtitan (closest: #1336, which made it the default)",
    affected="torchtitan 0.3.0 (reproduced here); the default since pytorch/torchtitan#1336 "
             "(June 2025, a change its author calls BC breaking)",
    fixed="open: last_save_model_only=False (what torchtitan's own llama3 configurations set) "
          "makes the final save a full one (--fixed)",
    reproduced_with="the real library: torchtitan 0.3.0's Trainer and CheckpointManager on torch "
                    "2.13.0, 2 gloo ranks on CPU (pytest_reshard.adapters.torchtitan_cpu's "
                    "patches, none of them in checkpointing; torchtitan.instrument)",
    checker="liveness",
    message="Missing key in checkpoint state_dict",
    # rank 1 dies right after the final save (harness step 7 is torchtitan's step 8) returned
    faults=lambda: [chaos.kill(rank=1, at_step=7, phase="checkpoint_commit")],
    world_size=2,
    steps=8,
    notes="Searched pytorch/torchtitan for last_save_model_only / model_weights_only and a "
          "restart or resume after the final step, and for 'Missing key in checkpoint "
          "state_dict' with a model-only checkpoint: #1336 made the default, #336 (a maintainer: "
          "the model-only save is 'the very last checkpoint' because the others 'can also be "
          "used for fault tolerance') and #961 (the same error from torch.compile's keys, "
          "another cause); none reports this. The kill is rank 1's, after its DCP save of "
          "step-8/ returned: the harness relaunches the job as a scheduler's retry would, with "
          "the same command; _find_load_step takes step-8/ (it has a .metadata), the full load "
          "asks for the optimizer, scheduler, data loader and train state, and DCP raises on "
          "every rank before the first step, which liveness quotes. The adapter records a "
          "model-only save with its model digest alone, so a resume from it would be judged by "
          "what it lacks; the load never returns here. reproduce.py drives torchtitan's "
          "CheckpointManager the way the Trainer does, in one process (the Trainer does not run "
          "on CPU unpatched). With --fixed the restart loads a full step-8/, trains nothing, "
          "and every checker passes. Not shown: how often a job is restarted after its final "
          "save (one that exits 0 is usually not retried; one whose rank dies in teardown is).",
)
