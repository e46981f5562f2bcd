"""The Trainer resuming from a checkpoint without a rank's RNG file, without the harness: a job of
2 gloo processes (this script again under ``torchrun``, loopback) trains a tiny GPT-2 with
dropout, saving every 2 steps, and stops after step 4. ``rng_state_1.pth`` is then removed from
``checkpoint-4`` (what a kill of process 1 inside that save leaves: process 0 writes the rest),
and a second job resumes as the Trainer's examples do, from ``get_last_checkpoint``. Each process
keeps its torch RNG at its first resumed step (right after the Trainer's restore) and what the
Trainer logged about it. Exits 1 when a process resumed with an RNG that is not the one its save
held (process 1, with only an INFO line to say so), or 0 with ``--fixed`` (the workaround: the
newest checkpoint with every process's RNG file, ``checkpoint-2``)."""
import ctypes
import json
import os
import random
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
    args = TrainingArguments(output_dir=out, max_steps=6, save_strategy="steps", save_steps=2,
                             per_device_train_batch_size=4, learning_rate=5e-3, seed=0,
                             use_cpu=True, report_to="none", disable_tqdm=True, ddp_timeout=60)
    trainer = Trainer(model=model, args=args, train_dataset=Data(), callbacks=[Watch()])
    last = None
    if mode == "resume":
        if fixed:
            needed = ["trainer_state.json"] + [f"rng_state_{r}.pth" for r in range(WORLD)]
            done = [d for d in Path(out).glob("checkpoint-*")
                    if all((d / n).is_file() for n in needed)]
            last = str(max(done, key=lambda d: int(d.name.split("-")[-1])))
        else:
            last = get_last_checkpoint(out)
    trainer.train(resume_from_checkpoint=last)
    if mode == "resume":
        (folder / f"resumed-{args.process_index}.json").write_text(
            json.dumps({"checkpoint": Path(last).name, "said": said}))
    if torch.distributed.is_initialized():   # the Trainer leaves its process group up
        torch.distributed.barrier()   # every rank is done: nothing left for gloo's threads
        torch.distributed.destroy_process_group()


def job(mode: str, folder: str, fixed: bool) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
           str(WORLD), "--master-addr", "127.0.0.1", "--master-port", str(port), __file__,
           "--worker", mode, folder] + (["--fixed"] if fixed else [])
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
    out = Path(d) / "out"
    saved = {(c.name, r): torch.load(c / f"rng_state_{r}.pth", weights_only=False)["cpu"]
             for c in out.glob("checkpoint-*") for r in range(WORLD)}
    (out / "checkpoint-4" / "rng_state_1.pth").unlink()   # what process 1's death leaves
    print("checkpoint-4 holds everything but rng_state_1.pth (process 1 died in that save)")
    job("resume", d, fixed)
    code = 0
    for rank in range(WORLD):
        got = json.loads((Path(d) / f"resumed-{rank}.json").read_text())
        rng = torch.load(Path(d) / f"resumed-rng-{rank}.pt")
        same = torch.equal(rng, saved[(got["checkpoint"], rank)])
        print(f"process {rank}: resumed from {got['checkpoint']}, its torch RNG "
              f"{'is' if same else 'is NOT'} the one it saved there"
              + (f"; the Trainer said only {got['said']}" if got["said"] else ""))
        code |= not same
    if code:
        print("(an INFO record: at the default verbosity, WARNING, the job prints nothing)")
    sys.exit(code)
