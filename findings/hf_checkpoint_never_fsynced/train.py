"""A user's Hugging Face Trainer script (a tiny GPT-2 built from its config, synthetic data,
``hf.instrument``; nothing downloads), 2 processes, a save every 2 steps, and a restart resumes
from ``get_last_checkpoint(output_dir)``.

The bug (transformers 5.24.0, no upstream report found): ``_save_checkpoint`` writes every file
of ``checkpoint-N/`` (safetensors 0.8's ``save_file``, ``torch.save``, ``json``) and fsyncs
none of them, nor the folder, so a power loss can take a checkpoint the job has already
reported saved, however long ago the kernel had it.
``--fixed``: the workaround, a callback that fsyncs every file of the new checkpoint, the
checkpoint's folder and ``output_dir`` when the save is done (``on_save``, on every process)."""
import argparse
import os
import random
from pathlib import Path

import torch
from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback,
                          TrainingArguments)
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


def fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Durable(TrainerCallback):
    """The workaround: make the checkpoint just saved durable."""

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        for f in folder.iterdir():
            if f.is_file():
                fsync(f)
        fsync(folder)
        fsync(Path(args.output_dir))


torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=16, n_layer=1,
                                   n_head=2))
training_args = TrainingArguments(
    output_dir="hf-out", max_steps=args.steps, save_strategy="steps", save_steps=2,
    per_device_train_batch_size=8 // world, learning_rate=5e-3, seed=0, logging_steps=1,
    report_to="none", use_cpu=True, disable_tqdm=True, ddp_timeout=60)
trainer = Trainer(model=model, args=training_args, train_dataset=Synthetic(),
                  callbacks=[Durable()] if args.fixed else None)
hf.instrument(trainer, sample_ids="sample_id")
out = training_args.output_dir   # under the harness: the run's work folder
trainer.train(resume_from_checkpoint=get_last_checkpoint(out) if os.path.isdir(out) else None)
