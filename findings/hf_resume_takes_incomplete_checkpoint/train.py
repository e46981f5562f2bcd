"""A user's Hugging Face Trainer script (a tiny GPT-2 built from its config, synthetic data,
``hf.instrument``; nothing downloads) that saves every 2 steps and, started again, resumes from
the newest checkpoint: ``get_last_checkpoint(output_dir)``, as the Trainer's examples do.

The bug (huggingface/transformers#35525, open): ``_save_checkpoint`` writes straight into
``checkpoint-N/`` (config, weights, optimizer, scheduler, RNG, and ``trainer_state.json`` last),
and ``get_last_checkpoint`` takes the highest-numbered ``checkpoint-*`` folder whether or not
it is complete. A job killed inside a save cannot start again: every restart loads the torn
folder and dies, and nothing falls back to the complete one before it.
``--fixed``: the workaround users apply, resume from the newest checkpoint that holds
``trainer_state.json`` (the file the Trainer writes last)."""
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
    """The newest ``checkpoint-N`` whose save finished: it holds ``trainer_state.json``."""
    done = [d for d in Path(folder).glob("checkpoint-*") if (d / "trainer_state.json").is_file()]
    return str(max(done, key=lambda d: int(d.name.split("-")[-1]))) if done else None


torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=16, n_layer=1,
                                   n_head=2))
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
