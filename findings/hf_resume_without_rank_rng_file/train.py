"""A user's Hugging Face Trainer script (a tiny GPT-2 built from its config with dropout 0.1,
synthetic data, ``hf.instrument``; nothing downloads), 2 processes under ``torchrun``, a save
every 2 steps, and a restart resumes from ``get_last_checkpoint(output_dir)``.

The bug (transformers 5.24.0, no upstream report found): each process writes its own RNG file,
``rng_state_{rank}.pth``, and process 0 writes the rest. A process killed inside a save leaves a
``checkpoint-N/`` that has everything but its RNG file, and ``get_last_checkpoint`` takes it.
On the resume ``_load_rng_state`` of that rank finds no file, logs at INFO level ("Didn't find an
RNG file for process 1, if you are resuming a training that wasn't launched in a distributed
fashion, reproducibility is not guaranteed.") and goes on with the RNG it was seeded with: its
dropout masks are not those of the run it resumes.
``--fixed``: the workaround, resume from the newest checkpoint that holds every rank's RNG file
(and ``trainer_state.json``)."""
import argparse
import os
import random
from pathlib import Path

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


def last_complete(folder: str) -> str | None:
    """The newest ``checkpoint-N`` that every rank finished: it holds ``trainer_state.json``
    and the RNG file of each of this job's ranks."""
    needed = ["trainer_state.json"] + [f"rng_state_{r}.pth" for r in range(world)]
    done = [d for d in Path(folder).glob("checkpoint-*")
            if all((d / name).is_file() for name in needed)]
    return str(max(done, key=lambda d: int(d.name.split("-")[-1]))) if done else None


torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=16, n_layer=1,
                                   n_head=2, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1))
training_args = TrainingArguments(
    output_dir="hf-out", max_steps=args.steps, save_strategy="steps", save_steps=2,
    per_device_train_batch_size=8 // world, learning_rate=5e-3, seed=0, logging_steps=1,
    report_to="none", use_cpu=True, disable_tqdm=True, ddp_timeout=60)
trainer = Trainer(model=model, args=training_args, train_dataset=Synthetic())
hf.instrument(trainer, sample_ids="sample_id")
out = training_args.output_dir   # under the harness: the run's work folder
if not os.path.isdir(out):
    last = None
else:
    last = last_complete(out) if args.fixed else get_last_checkpoint(out)
trainer.train(resume_from_checkpoint=last)
