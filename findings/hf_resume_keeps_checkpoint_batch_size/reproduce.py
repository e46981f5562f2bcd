"""huggingface/transformers#43708 without the harness, the report's own example, in one process:
train a tiny GPT-2 with per-device batch 1 and gradient accumulation 4 (8 optimizer steps for
32 samples, one epoch), stop at step 4 with its checkpoint, and resume with per-device batch 4
and no accumulation (the same global batch: 8 steps still). transformers <= 5.1.0 restores the
checkpoint's batch of 1 and counts 32 steps; the installed Trainer has 5.2.0's fix, so the bug
is shown by doing before ``train`` the two lines 5.1.0 ran inside it. Exits 1 when the resumed
run counts another max_steps (the bug), or 0 with ``--fixed`` (the installed Trainer as it is)."""
import os
import sys
import tempfile

import torch
from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback,
                          TrainingArguments)
from transformers.trainer_callback import TrainerState
from transformers.utils import logging

fixed = "--fixed" in sys.argv
logging.set_verbosity_error()


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        ids = torch.tensor([(i + k) % 32 for k in range(8)])
        return {"input_ids": ids, "labels": ids.clone()}


class Watch(TrainerCallback):
    def __init__(self, stop_at: int):
        self.stop_at, self.max_steps = stop_at, None

    def on_train_begin(self, args, state, control, **kw):
        self.max_steps = state.max_steps

    def on_step_end(self, args, state, control, **kw):
        if state.global_step >= self.stop_at:
            control.should_save = control.should_training_stop = True


def trainer(out: str, per_device: int, accumulation: int, stop_at: int) -> tuple[Trainer, Watch]:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=8, n_embd=16, n_layer=1,
                                       n_head=2))
    args = TrainingArguments(output_dir=out, num_train_epochs=1, per_device_train_batch_size=per_device,
                             gradient_accumulation_steps=accumulation, save_strategy="no",
                             use_cpu=True, report_to="none", disable_tqdm=True, seed=0)
    watch = Watch(stop_at)
    return Trainer(model=model, args=args, train_dataset=Data(), callbacks=[watch]), watch


out = tempfile.TemporaryDirectory()
first, watch = trainer(out.name, per_device=1, accumulation=4, stop_at=4)
first.train()
print(f"per-device 1 x accumulation 4: max_steps {watch.max_steps}, saved at step 4")
expected = watch.max_steps

last = os.path.join(out.name, "checkpoint-4")
second, watch = trainer(out.name, per_device=4, accumulation=1, stop_at=5)
if not fixed:
    # transformers 5.1.0, Trainer.train(), after the checkpoint's model is loaded:
    state = TrainerState.load_from_json(os.path.join(last, "trainer_state.json"))
    if state.train_batch_size is not None:
        second._train_batch_size = state.train_batch_size
second.train(resume_from_checkpoint=last)
print(f"resumed as per-device 4 x accumulation 1: data loader batch {second._train_batch_size}, "
      f"max_steps {watch.max_steps} (the same global batch: {expected} expected)")
out.cleanup()
sys.exit(0 if watch.max_steps == expected else 1)
