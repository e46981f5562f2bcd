"""A user's Hugging Face Trainer script (a tiny GPT-2 built from its config, synthetic data,
``hf.instrument``; nothing downloads) that holds the global batch at 8 across world sizes: the
per-device batch is 8 / world size, so 4 ranks x 2 resume as 2 ranks x 4.

The bug (huggingface/transformers#43708, transformers <= 5.1.0): ``Trainer.train`` restored
``_train_batch_size`` from the checkpoint's ``trainer_state.json`` whenever it held one, so the
resumed run built its data loader with the old per-device batch (2), not its arguments' (4): a
global batch of 4, and the data skip (global_step batches per rank) lands short of what the 4
ranks consumed. 5.2.0 restores it only with ``auto_find_batch_size``, and the installed Trainer
has that fix, so this script does before ``train`` what 5.1.0 did inside it (the two lines).
``--fixed``: the installed Trainer as it is."""
import argparse
import os
import random
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers.trainer_callback import TrainerState
from transformers.trainer_utils import get_last_checkpoint

from pytest_reshard import probe
from pytest_reshard.adapters import hf

p = argparse.ArgumentParser()
p.add_argument("--fixed", action="store_true")
p.add_argument("--steps", type=int, default=int(os.environ.get("RESHARD_STEPS", 8)))
p.add_argument("--global-batch", type=int, default=8)
p.add_argument("--save-steps", type=int, default=3)
args = p.parse_args()

SEQ, VOCAB = 8, 32
world = int(os.environ.get("WORLD_SIZE", 1))
out = str(probe.attach().workdir or Path("hf-out"))


class Synthetic(torch.utils.data.Dataset):
    """Sample i is a fixed token sequence made from i; its id is i."""

    def __len__(self):
        return 256

    def __getitem__(self, i):
        rng = random.Random(i)
        start, stride = rng.randrange(VOCAB), rng.randrange(1, 5)
        ids = torch.tensor([(start + stride * k) % VOCAB for k in range(SEQ)])
        return {"input_ids": ids, "labels": ids.clone(), "sample_id": i}


torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=16, n_layer=1,
                                   n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
training_args = TrainingArguments(
    output_dir=out, max_steps=args.steps, save_strategy="steps", save_steps=args.save_steps,
    per_device_train_batch_size=args.global_batch // world,
    learning_rate=5e-3, lr_scheduler_type="linear", optim="adamw_torch", seed=0,
    logging_steps=1, report_to="none", use_cpu=True, disable_tqdm=True,
    ddp_timeout=60, dataloader_num_workers=0, save_only_model=False)
trainer = Trainer(model=model, args=training_args, train_dataset=Synthetic())
hf.instrument(trainer, sample_ids="sample_id")
out = training_args.output_dir   # under the harness: the run's work folder
last = get_last_checkpoint(out) if os.path.isdir(out) else None
if last is not None and not args.fixed:
    # transformers 5.1.0, Trainer.train(), after the checkpoint's model is loaded:
    state = TrainerState.load_from_json(os.path.join(last, "trainer_state.json"))
    if state.train_batch_size is not None:
        trainer._train_batch_size = state.train_batch_size
trainer.train(resume_from_checkpoint=last)
