"""A user's Hugging Face Trainer script (a tiny GPT-2 built from its config, synthetic data,
``hf.instrument``; nothing downloads) that holds the global batch at 8 whatever the number of
processes, saves every 2 steps and resumes from ``get_last_checkpoint``: started with
``torchrun --nproc-per-node 2``, resumed with one process. Its regulariser draws from the RNG:
DropConnect on the MLP's first weight (one mask a step, whatever the batch; dropout on the
activations would draw per sample, and make the loss depend on how the batch is split).

The bug (transformers 5.24.0): a distributed save writes one RNG file per process,
``rng_state_{rank}.pth``, and a one-process save writes ``rng_state.pth``; ``_load_rng_state``
at world size 1 looks only for ``rng_state.pth``. A single process resuming a 2-process
checkpoint finds none, logs at INFO level ("Didn't find an RNG file, if you are resuming a
training that was launched in a distributed fashion, reproducibility is not guaranteed.") and
keeps the RNG it was seeded with.
``--fixed``: the workaround, a single process resuming a distributed checkpoint gives the
Trainer process 0's RNG file as ``rng_state.pth``."""
import argparse
import os
import random
import shutil
from pathlib import Path

import torch
from torch.nn.utils import parametrize
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


def one_process_rng(checkpoint: str) -> None:
    """The workaround: a distributed checkpoint read by one process gets the RNG file the
    Trainer looks for, process 0's."""
    single, first = Path(checkpoint) / "rng_state.pth", Path(checkpoint) / "rng_state_0.pth"
    if world == 1 and not single.exists() and first.exists():
        shutil.copyfile(first, single)


class DropConnect(torch.nn.Module):
    """Drops weights, not activations: a mask of the weight's shape, drawn at each forward."""

    def forward(self, weight):
        return torch.nn.functional.dropout(weight, 0.1, self.training)


torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=16, n_layer=1,
                                   n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
parametrize.register_parametrization(model.transformer.h[0].mlp.c_fc, "weight", DropConnect())
training_args = TrainingArguments(
    output_dir="hf-out", max_steps=args.steps, save_strategy="steps", save_steps=2,
    per_device_train_batch_size=8 // world, learning_rate=5e-3, seed=0, logging_steps=1,
    report_to="none", use_cpu=True, disable_tqdm=True, ddp_timeout=60)
trainer = Trainer(model=model, args=training_args, train_dataset=Synthetic())
hf.instrument(trainer, sample_ids="sample_id")
out = training_args.output_dir   # under the harness: the run's work folder
last = get_last_checkpoint(out) if os.path.isdir(out) else None
if last is not None and args.fixed:
    one_process_rng(last)
trainer.train(resume_from_checkpoint=last)
