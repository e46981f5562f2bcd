"""The Trainer resumed on fewer processes with a fixed per-device batch, without the harness: a
job of 4 gloo processes (this script again under ``torchrun``, loopback) trains a tiny GPT-2
with ``per_device_train_batch_size=2`` on 64 samples (sample i starts with token i), saving every
2 steps, and stops after step 4; a job of 2 processes resumes from ``get_last_checkpoint`` and
trains steps 5 and 6. Every process lists the samples of its batches (in ``compute_loss``).
Exits 1 when the resumed job trains samples the first job had trained (it skipped 4 batches of
2 x 2, not 4 x 2), or 0 with ``--fixed`` (the global batch held at 8: per-device 2, then 4)."""
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def worker(mode: str, folder: Path, fixed: bool) -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG: die with torchrun
    import torch
    from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback,
                              TrainingArguments)
    from transformers.trainer_utils import get_last_checkpoint
    from transformers.utils import logging

    logging.set_verbosity_error()
    seen: list[int] = []

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            ids = torch.tensor([(i + k) % 64 for k in range(8)])
            return {"input_ids": ids, "labels": ids.clone()}

    class Listing(Trainer):
        def compute_loss(self, model, inputs, *a, **kw):
            seen.extend(inputs["input_ids"][:, 0].tolist())   # the batch's sample ids
            return super().compute_loss(model, inputs, *a, **kw)

    class StopAt4(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if mode == "train" and state.global_step == 4:
                control.should_training_stop = True   # the save of step 4 still happens

    world = int(os.environ["WORLD_SIZE"])
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=8, n_embd=16, n_layer=1,
                                       n_head=2))
    out = str(folder / "out")
    args = TrainingArguments(output_dir=out, max_steps=6, save_strategy="steps", save_steps=2,
                             per_device_train_batch_size=8 // world if fixed else 2,
                             learning_rate=5e-3, seed=0, use_cpu=True, report_to="none",
                             disable_tqdm=True, ddp_timeout=60)
    trainer = Listing(model=model, args=args, train_dataset=Data(), callbacks=[StopAt4()])
    trainer.train(resume_from_checkpoint=get_last_checkpoint(out) if mode == "resume" else None)
    (folder / f"{mode}-{args.process_index}.json").write_text(json.dumps(seen))
    if torch.distributed.is_initialized():   # the Trainer leaves its process group up
        torch.distributed.barrier()   # every rank is done: nothing left for gloo's threads
        torch.distributed.destroy_process_group()


def job(mode: str, processes: int, folder: str, fixed: bool) -> list[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
           str(processes), "--master-addr", "127.0.0.1", "--master-port", str(port), __file__,
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
    return [i for r in range(processes)
            for i in json.loads((Path(folder) / f"{mode}-{r}.json").read_text())]


if sys.argv[1:2] == ["--worker"]:
    worker(sys.argv[2], Path(sys.argv[3]), "--fixed" in sys.argv)
    sys.exit(0)

fixed = "--fixed" in sys.argv
# both jobs together, and every wait is bounded by it: at most 65 s alone on 2 busy cores, 5x
# that for a loaded machine
DEADLINE = time.monotonic() + 330
with tempfile.TemporaryDirectory() as d:
    first = job("train", 4, d, fixed)
    print(f"4 processes x 2 a batch, steps 1-4: {len(first)} samples, then checkpoint-4")
    resumed = job("resume", 2, d, fixed)
    per_device = 4 if fixed else 2
    print(f"2 processes x {per_device} a batch resumed from checkpoint-4, steps 5-6: "
          f"samples {sorted(resumed)}")
    again = sorted(set(first) & set(resumed))
    if again:
        print(f"trained twice: {again} ({len(again)} of the {len(resumed)} resumed samples; "
              "the resume skipped 4 batches of the new size, "
              f"{4 * 2 * per_device} samples, not the {len(first)} consumed)")
    sys.exit(1 if again else 0)
