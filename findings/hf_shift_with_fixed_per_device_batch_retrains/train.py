"""A user's Hugging Face Trainer script (a tiny GPT-2 built from its config, synthetic data,
``hf.instrument``; nothing downloads) with a fixed ``per_device_train_batch_size=2``, a save
every 2 steps, and a restart that resumes from ``get_last_checkpoint``: started with
``torchrun --nproc-per-node 4`` and resumed with 2 processes (fewer machines after a
preemption).

The bug (transformers 5.24.0, and every version that counts the resume in optimizer steps): the
checkpoint holds ``global_step`` and no count of samples; the resumed Trainer skips
``global_step`` batches of the *new* data loader. 4 ranks x 2 consumed 8 samples a step; 2 ranks
x 2 skip 4 a step, so after ``checkpoint-4`` (32 samples consumed) the 2 ranks skip 16 and train
samples 16..31 of the shuffled order a second time.
``--fixed``: hold the global batch, per-device 8 / world size (2, then 4)."""
import argparse
import os
import random

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from pytest_reshard.adapters import hf

p = argparse.ArgumentParser()
p.add_argument("--fixed", action="store_true")
p.add_argument("--steps", type=int, default=int(os.environ.get("RESHARD_STEPS", 6)))
args = p.parse_args()

SEQ, VOCAB = 8, 32
world = int(os.environ.get("WORLD_SIZE", 1))


class Synthetic(torch.utils.data.Dataset):
    """Sample i is a fixed token sequence made from i; its id is i."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        rng = random.Random(i)
        start, stride = rng.randrange(VOCAB), rng.randrange(1, 5)
        ids = torch.tensor([(start + stride * k) % VOCAB for k in range(SEQ)])
        return {"input_ids": ids, "labels": ids.clone(), "sample_id": i}


torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=16, n_layer=1,
                                   n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
training_args = TrainingArguments(
    output_dir="hf-out", max_steps=args.steps, save_strategy="steps", save_steps=2,
    per_device_train_batch_size=8 // world if args.fixed else 2,
    learning_rate=5e-3, seed=0, logging_steps=1, report_to="none", use_cpu=True,
    disable_tqdm=True, ddp_timeout=60)
trainer = Trainer(model=model, args=training_args, train_dataset=Synthetic())
hf.instrument(trainer, sample_ids="sample_id")
out = training_args.output_dir   # under the harness: the run's work folder
last = get_last_checkpoint(out) if os.path.isdir(out) else None
trainer.train(resume_from_checkpoint=last)
