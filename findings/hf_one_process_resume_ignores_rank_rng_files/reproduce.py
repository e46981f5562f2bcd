"""A one-process resume of a 2-process Trainer checkpoint, without the harness: a job of 2 gloo
processes (this script again under ``torchrun``, loopback) trains a tiny GPT-2 with dropout,
saving every 2 steps, and stops after step 4; ``checkpoint-4`` holds ``rng_state_0.pth`` and
``rng_state_1.pth``. The job is resumed with plain ``python`` (one process), from
``get_last_checkpoint``; it keeps its torch RNG at its first resumed step (right after the
Trainer's restore) and what the Trainer logged about it. Exits 1 when that RNG is not the one
process 0 saved (the Trainer looked for ``rng_state.pth`` only, and said so at INFO level), or 0
with ``--fixed`` (the workaround: ``rng_state_0.pth`` copied to ``rng_state.pth`` first)."""
import ctypes
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

WORLD = 2


def worker(mode: str, folder: Path, fixed: bool) -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG: die with torchrun
    from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback,
                              TrainingArguments)
    from transformers.trainer_utils import get_last_checkpoint
    from transformers.utils import logging

    logging.set_verbosity_error()
    said: list[str] = []   # what the Trainer logs about the RNG, at any level

    class Keep(logging.logging.Handler):
        def emit(self, record):
            if "RNG" in record.getMessage():
                said.append(f"{record.levelname}: {record.getMessage()}")

    trainer_log = logging.get_logger("transformers.trainer")
    trainer_log.setLevel(logging.INFO)
    trainer_log.propagate = False          # kept here, not printed
    trainer_log.addHandler(Keep())

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            r = random.Random(i)
            a, b = r.randrange(32), r.randrange(1, 5)
            ids = torch.tensor([(a + b * k) % 32 for k in range(8)])
            return {"input_ids": ids, "labels": ids.clone()}

    class Watch(TrainerCallback):
        first = True

        def on_step_begin(self, args, state, control, **kw):
            if mode == "resume" and self.first:
                self.first = False
                torch.save(torch.get_rng_state(), folder / f"resumed-rng-{args.process_index}.pt")

        def on_step_end(self, args, state, control, **kw):
            if mode == "train" and state.global_step == 4:
                control.should_training_stop = True   # the save of step 4 still happens

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=8, n_embd=16, n_layer=1,
                                       n_head=2, resid_pdrop=0.1, embd_pdrop=0.1,
                                       attn_pdrop=0.1))
    out = str(folder / "out")
    per_device = 8 // int(os.environ.get("WORLD_SIZE", 1))   # the global batch: 8
    args = TrainingArguments(output_dir=out, max_steps=6, save_strategy="steps", save_steps=2,
                             per_device_train_batch_size=per_device, learning_rate=5e-3, seed=0,
                             use_cpu=True, report_to="none", disable_tqdm=True, ddp_timeout=60)
    trainer = Trainer(model=model, args=args, train_dataset=Data(), callbacks=[Watch()])
    last = get_last_checkpoint(out) if mode == "resume" else None
    if last is not None and fixed:
        shutil.copyfile(Path(last) / "rng_state_0.pth", Path(last) / "rng_state.pth")
    trainer.train(resume_from_checkpoint=last)
    if mode == "resume":
        (folder / f"resumed-{args.process_index}.json").write_text(
            json.dumps({"checkpoint": Path(last).name, "said": said}))
    if torch.distributed.is_initialized():   # the Trainer leaves its process group up
        torch.distributed.barrier()   # every rank is done: nothing left for gloo's threads
        torch.distributed.destroy_process_group()


def job(mode: str, folder: str, fixed: bool) -> None:
    """``train``: 2 processes under torchrun; ``resume``: one plain process."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launch = ["-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(WORLD),
              "--master-addr", "127.0.0.1", "--master-port", str(port)]
    cmd = [sys.executable, *(launch if mode == "train" else []), __file__, "--worker", mode,
           folder] + (["--fixed"] if fixed else [])
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True, env={**os.environ, "GLOO_SOCKET_IFNAME": "lo"})
    try:
        log, _ = p.communicate(timeout=max(1.0, DEADLINE - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)   # torchrun, and so its workers (PR_SET_PDEATHSIG)
        p.communicate(timeout=10)
        print(f"the {mode} job did not finish in time (the whole run has 330 s)")
        sys.exit(2)
    if p.returncode:
        print(f"the {mode} job failed:\n{log}")
        sys.exit(2)


if sys.argv[1:2] == ["--worker"]:
    worker(sys.argv[2], Path(sys.argv[3]), "--fixed" in sys.argv)
    sys.exit(0)

fixed = "--fixed" in sys.argv
# both jobs together, and every wait is bounded by it: at most 65 s alone on 2 busy cores, 5x
# that for a loaded machine
DEADLINE = time.monotonic() + 330
with tempfile.TemporaryDirectory() as d:
    job("train", d, fixed)
    checkpoint = Path(d) / "out" / "checkpoint-4"
    saved = torch.load(checkpoint / "rng_state_0.pth", weights_only=False)["cpu"]
    print(f"2 processes saved {checkpoint.name}: "
          f"{', '.join(sorted(p.name for p in checkpoint.glob('rng_state*')))}")
    job("resume", d, fixed)
    got = json.loads((Path(d) / "resumed-0.json").read_text())
    same = torch.equal(torch.load(Path(d) / "resumed-rng-0.pt"), saved)
    print(f"one process resumed from {got['checkpoint']}: its torch RNG "
          f"{'is' if same else 'is NOT'} the one process 0 saved there"
          + (f"; the Trainer said only {got['said']} (an INFO record: the default verbosity, "
             "WARNING, prints nothing)" if got["said"] else ""))
    sys.exit(0 if same else 1)
