"""A user's Hugging Face Trainer script: a tiny GPT-2 built from its config, synthetic data,
and the one line ``hf.instrument(trainer, sample_ids="sample_id")``. Nothing downloads.

Options: ``--dropout P`` (0 by default), ``--global-batch N`` (held constant: the per-device
batch is N / world size) or ``--per-device-batch N`` (fixed: the global batch changes with the
world size), ``--save-steps K``.
"""
import argparse
import os
import random
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from pytest_reshard import probe
from pytest_reshard.adapters import hf

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=int(os.environ.get("RESHARD_STEPS", 8)))
p.add_argument("--dropout", type=float, default=0.0)
p.add_argument("--global-batch", type=int, default=8)
p.add_argument("--per-device-batch", type=int, default=None)
p.add_argument("--save-steps", type=int, default=3)
p.add_argument("--samples", type=int, default=256)
p.add_argument("--no-resume", action="store_true", help="the bug: never pass resume_from_checkpoint")
p.add_argument("--no-sample-ids", action="store_true", help="batches without the sample_id column")
args = p.parse_args()

SEQ, VOCAB = 8, 32
world = int(os.environ.get("WORLD_SIZE", 1))
out = str(probe.attach().workdir or Path("hf-out"))


class Synthetic(torch.utils.data.Dataset):
    """Sample i is a fixed token sequence made from i; its id is i."""

    def __len__(self):
        return args.samples

    def __getitem__(self, i):
        rng = random.Random(i)
        start, stride = rng.randrange(VOCAB), rng.randrange(1, 5)
        ids = torch.tensor([(start + stride * k) % VOCAB for k in range(SEQ)])
        return {"input_ids": ids, "labels": ids.clone(),
                **({} if args.no_sample_ids else {"sample_id": i})}


torch.manual_seed(0)
config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=16, n_layer=1, n_head=2,
                    resid_pdrop=args.dropout, embd_pdrop=args.dropout, attn_pdrop=args.dropout)
model = GPT2LMHeadModel(config)
training_args = TrainingArguments(
    output_dir=out, max_steps=args.steps, save_strategy="steps", save_steps=args.save_steps,
    per_device_train_batch_size=args.per_device_batch or args.global_batch // world,
    learning_rate=5e-3, lr_scheduler_type="linear", optim="adamw_torch", seed=0,
    logging_steps=1, report_to="none", use_cpu=True, disable_tqdm=True,
    ddp_timeout=60, dataloader_num_workers=0, save_only_model=False)
trainer = Trainer(model=model, args=training_args, train_dataset=Synthetic())
hf.instrument(trainer, sample_ids="sample_id")
last = get_last_checkpoint(out) if os.path.isdir(out) else None
trainer.train(resume_from_checkpoint=None if args.no_resume else last)
