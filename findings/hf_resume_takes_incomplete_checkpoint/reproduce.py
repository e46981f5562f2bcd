"""huggingface/transformers#35525 without the harness, one process at a time: a Trainer (tiny
GPT-2, synthetic data) saves every 2 steps. Once ``checkpoint-2`` is written, the job's file-size
limit (RLIMIT_FSIZE) is set to half of a ``model.safetensors``, so the kernel kills the job
(SIGXFSZ) in the middle of the next save, when safetensors sizes the weights' file (it writes a
``.tmpXXXXXX`` file and renames it to ``model.safetensors`` once written), as a preemption or an
OOM kill inside a save would. The job is then started again as the Trainer's examples do,
``resume_from_checkpoint=get_last_checkpoint(output_dir)``. Exits 1 when that restart fails (it
takes ``checkpoint-4``, which has no weights), or 0 with ``--fixed`` (the workaround: the newest
checkpoint that holds ``trainer_state.json``; the restart resumes from ``checkpoint-2`` and
finishes)."""
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback,
                          TrainingArguments)
from transformers.trainer_utils import get_last_checkpoint
from transformers.utils import logging

logging.set_verbosity_error()


class Synthetic(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        rng = random.Random(i)
        start, stride = rng.randrange(32), rng.randrange(1, 5)
        ids = torch.tensor([(start + stride * k) % 32 for k in range(8)])
        return {"input_ids": ids, "labels": ids.clone()}


class DieInTheNextSave(TrainerCallback):
    """After the first save: no file of this process may grow past half a model.safetensors;
    the kernel kills it (SIGXFSZ, its default action) at the write that would."""

    def on_save(self, args, state, control, **kw):
        if state.global_step == 2:
            weights = Path(args.output_dir) / "checkpoint-2" / "model.safetensors"
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            resource.setrlimit(resource.RLIMIT_FSIZE, (weights.stat().st_size // 2,) * 2)
            signal.signal(signal.SIGXFSZ, signal.SIG_DFL)   # Python starts with it ignored


def trainer(out: str, callbacks=()) -> Trainer:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=8, n_embd=16, n_layer=1,
                                       n_head=2))
    args = TrainingArguments(output_dir=out, max_steps=6, save_strategy="steps", save_steps=2,
                             per_device_train_batch_size=8, learning_rate=5e-3, seed=0,
                             use_cpu=True, report_to="none", disable_tqdm=True)
    return Trainer(model=model, args=args, train_dataset=Synthetic(), callbacks=list(callbacks))


def last_complete(folder: str) -> str | None:
    done = [d for d in Path(folder).glob("checkpoint-*") if (d / "trainer_state.json").is_file()]
    return str(max(done, key=lambda d: int(d.name.split("-")[-1]))) if done else None


if sys.argv[1:2] == ["--job"]:
    trainer(sys.argv[2], [DieInTheNextSave()]).train()
    sys.exit(0)

fixed = "--fixed" in sys.argv
with tempfile.TemporaryDirectory() as out:
    job = subprocess.Popen([sys.executable, __file__, "--job", out], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        log, _ = job.communicate(timeout=110)   # 22 s alone on 2 busy cores; 5x for a loaded machine
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.communicate()
        print("the first job did not finish in 110 s")
        sys.exit(2)
    if job.returncode != -signal.SIGXFSZ:
        print(f"the first job ended with {job.returncode}, not killed inside its save:\n{log}")
        sys.exit(2)
    torn = Path(out) / "checkpoint-4"
    print(f"the job was killed inside its step-4 save: checkpoint-4 holds "
          f"{sorted(f'{p.name} ({p.stat().st_size} B)' for p in torn.iterdir())}; "
          f"checkpoint-2/model.safetensors is "
          f"{(Path(out) / 'checkpoint-2' / 'model.safetensors').stat().st_size} B")
    last = last_complete(out) if fixed else get_last_checkpoint(out)
    print(f"started again with resume_from_checkpoint={Path(last).name}")
    again = trainer(out)
    try:
        again.train(resume_from_checkpoint=last)
    except Exception as e:   # what the restarted job dies of, every time it is restarted
        print(f"the restart cannot resume: {type(e).__name__}: {e}")
        sys.exit(1)
    print(f"the restart resumed and finished at step {again.state.global_step}")
    sys.exit(0)
