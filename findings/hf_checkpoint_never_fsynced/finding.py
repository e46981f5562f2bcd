from findings import Finding
from pytest_reshard import chaos

FINDING = Finding(
    title="Trainer never fsyncs a checkpoint: a power loss takes one the job already reported "
          "saved",
    upstream="unreported: huggingface/transformers (no report of an fsync in _save_checkpoint "
             "found; the saves are safetensors' save_file and torch.save, which never fsync)",
    affected="transformers 5.24.0 (Trainer._save_checkpoint, with safetensors 0.8.0 and "
             "torch.save: no file of checkpoint-N/ and not the folder is ever fsynced)",
    fixed="open. Workaround (--fixed): an on_save callback that fsyncs every file of the new "
          "checkpoint, its folder and output_dir",
    reproduced_with="the real library: transformers 5.24.0's Trainer, 2 gloo ranks on torch "
                    "2.13.0, the machine's power cut (power_loss) as rank 0 makes "
                    "checkpoint-4/, the save after checkpoint-2",
    checker="crash_consistency",
    message="the power loss took the save of step 1, which the workload had recorded complete "
            "before it: `checkpoint-2/`",
    faults=lambda: [chaos.power_loss(at_step=3, path="checkpoint-4", op="mkdir", rank=0)],
    world_size=2,
    steps=6,
    notes="A save every 2 steps: checkpoint-2 was written and recorded saved two steps before "
          "the cut; none of its files was ever fsynced, so the power loss takes them all "
          "(crash_consistency names each, 'never fsynced: lost with the page cache', and "
          "model.safetensors' rename from its temporary, undone). The empty checkpoint-2/ "
          "folder stays (a mkdir is not undone), get_last_checkpoint takes it, and the job "
          "cannot start again ('Can't find a valid checkpoint'; liveness fails too). "
          "The harness models the pessimistic end of what POSIX "
          "allows after a crash: a real kernel writes dirty pages back within about 30 s "
          "(dirty_expire_centisecs), so the window in practice is the last half-minute of "
          "saves, not all of them; ext4 also syncs a file renamed over another. What the "
          "harness needed: power_loss (issue 29) and a fault named by its file. "
          "reproduce.py shows the mechanism without the harness: it counts the fsyncs a save "
          "makes (none). With the callback every checker passes.",
)
