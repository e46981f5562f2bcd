from findings import Finding
from pytest_reshard import chaos

FINDING = Finding(
    title="Trainer resumes from the newest checkpoint folder whether or not its save finished: "
          "a crash inside a save leaves a job that cannot start again",
    upstream="huggingface/transformers#35525 (open; the bug report #35782 was closed for it)",
    affected="transformers through 5.24.0 (reported on 4.45.2): _save_checkpoint writes into "
             "checkpoint-N/ itself and get_last_checkpoint takes the highest N",
    fixed="open. Two atomic saves (a tmp-checkpoint folder renamed at the end: #27820, "
          "December 2023; #35580, January 2025) were merged and taken out again after their "
          "renames failed in multi-GPU runs (#27925; the comments on #35580); 5.24.0 has "
          "neither. Workaround (#35525, and --fixed): resume from the newest checkpoint that "
          "holds trainer_state.json, or delete the torn folder",
    reproduced_with="the real library: transformers 5.24.0's Trainer and get_last_checkpoint "
                    "(safetensors 0.8.0), 2 gloo ranks on torch 2.13.0, rank 0 killed as it "
                    "starts writing checkpoint-4/model.safetensors",
    checker="crash_consistency",
    message="could not start again after generation 0 left the checkpoint of step 3 incomplete",
    # file event 11 from the start of step 3 on rank 0: the open of model.safetensors (the
    # recorded save: 3 mkdir, config.json, generation_config.json, then the weights)
    faults=lambda: [chaos.kill_at_file_event(at_step=3, event=11, mode="before", rank=0)],
    world_size=2,
    steps=6,
    notes="A save every 2 steps: checkpoint-2 is complete; rank 0 dies in the checkpoint-4 "
          "save before its weights exist (checkpoint-4 holds config.json, "
          "generation_config.json and rank 1's rng_state_1.pth). The next generation takes "
          "checkpoint-4 and dies in the load ('Can't find a valid checkpoint at "
          ".../checkpoint-4'; liveness fails too), and crash_consistency names the missing "
          "files. The file-event sweep of tests/scenarios/test_adapters_hf.py fails at every "
          "point of the save. safetensors 0.8.0 writes the weights to a .tmpXXXXXX file "
          "and renames it, so a real kill leaves no model.safetensors, never a torn one; the "
          "probe's native-writer model (pytest_reshard/rank/filewatch.py) makes the same "
          "temporary and rename, so the sweep's torn point is the temporary too. A fault may "
          "name its file (kill_at_file_event(path=..., op=...)), but the weights' first event "
          "is the open of that temporary, whose name is not the file's, so the entry keeps "
          "the event's count. With the "
          "workaround every checker passes: the job resumes from checkpoint-2, two steps "
          "back, within the save interval.",
)
