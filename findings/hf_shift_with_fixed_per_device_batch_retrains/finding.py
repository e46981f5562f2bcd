from findings import Finding
from pytest_reshard import chaos

FINDING = Finding(
    title="Trainer resumed on fewer processes with a fixed per-device batch skips global_step "
          "batches of the new size: samples the old job consumed are trained again",
    upstream="huggingface/transformers#22580 (open; the closest report: a resume on 3x the "
             "GPUs keeps the old step count, the data skip it implies is not discussed)",
    affected="transformers 5.24.0 (the checkpoint holds global_step, not samples consumed; "
             "_inner_training_loop skips global_step x accumulation batches of the new loader)",
    fixed="open. Workaround (--fixed): hold the global batch across world sizes "
          "(per_device_train_batch_size = global / world size, here 2 then 4)",
    reproduced_with="the real library: transformers 5.24.0's Trainer and accelerate 1.15.0's "
                    "skip_first_batches, 4 gloo ranks then 2, on torch 2.13.0",
    checker="exactly_once_samples",
    message="consumed twice",
    faults=lambda: [chaos.shift_shards(to_world_size=2, at_step=3)],
    world_size=4,
    steps=6,
    notes="per_device_train_batch_size=2 fixed: 4 ranks consume 8 samples a step and save "
          "checkpoint-4 after 32; the 2 ranks skip 4 batches of 2 x 2 = 16 samples, so the "
          "resumed steps 4 and 5 train samples 16..23 of the shuffled order a second time (8 "
          "duplicates: every sample they train; a longer run would retrain all of 16..31). "
          "state_equivalence fails too (the data position the adapter derives from per-device "
          "batch x world size: 32 samples at the save, 16 at the load); its hint ('the load "
          "read another step's checkpoint': 16 samples is what step 1's save held) is wrong "
          "here, the checkpoint is the right one. Arguably a consequence of counting in steps, "
          "but the global batch changes with the world size and the Trainer neither refuses "
          "nor warns. Dropout is 0: dropout drawn per rank makes the loss depend on the world "
          "size, and loss_continuity could not judge the fixed 4 -> 2 run. OLMo counts examples "
          "seen to resume after a batch size change (allenai/OLMo#182); the Trainer's "
          "checkpoint records train_batch_size (per device) but not the world size it was "
          "saved at. With the fix every checker passes.",
)
