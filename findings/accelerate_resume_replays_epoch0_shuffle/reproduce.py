"""huggingface/accelerate#3242 (and #4233) without the harness: 2 gloo processes (this script
started again under ``torch.distributed.run``) prepare a ``DataLoader(shuffle=True)`` of 16 ids,
2 a batch; one job lists epochs 0 and 1 and saves with ``save_state`` after batch 1 of epoch 1,
a second job ``load_state``s it and lists the rest of epoch 1 through ``skip_first_batches``.
Exits 1 when that is not the rest of epoch 1 (accelerate 1.15.0: epoch 0's order, the sampler's
generator is never saved; ``--live-generator``, the generator saved as it is at the save: an
order never trained on), or 0 with ``--fixed`` (the generator saved as the epoch began)."""
import ctypes
import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path


def worker(mode: str, folder: Path, variant: str) -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG: die with torchrun
    import torch
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    accelerator = Accelerator(cpu=True)
    set_seed(0)
    loader = accelerator.prepare(torch.utils.data.DataLoader(list(range(16)), batch_size=2,
                                                             shuffle=True))
    generator = loader.synchronized_generator       # the RandomSampler's, made by prepare

    class ShuffleState:
        drawn_from = generator.get_state()

        def epoch_begins(self) -> None:
            self.drawn_from = generator.get_state()

        def state_dict(self) -> dict:
            return {"generator": generator.get_state() if variant == "live" else self.drawn_from}

        def load_state_dict(self, state: dict) -> None:
            generator.set_state(state["generator"])

    shuffle = ShuffleState()
    if variant != "none":
        accelerator.register_for_checkpointing(shuffle)
    out: dict[str, list[int]] = {}
    if mode == "run":
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            shuffle.epoch_begins()
            out[str(epoch)] = []
            for k, batch in enumerate(loader):
                out[str(epoch)] += batch.tolist()
                if (epoch, k) == (1, 1):
                    accelerator.save_state(str(folder / "ckpt"))
    else:
        accelerator.load_state(str(folder / "ckpt"))
        loader.set_epoch(1)
        out["resumed"] = [i for b in accelerator.skip_first_batches(loader, 2) for i in b.tolist()]
    (folder / f"{mode}-{accelerator.process_index}.json").write_text(json.dumps(out))
    accelerator.end_training()


if sys.argv[1:2] == ["--worker"]:
    worker(sys.argv[2], Path(sys.argv[3]), sys.argv[4])
    sys.exit(0)
variant = "epoch-start" if "--fixed" in sys.argv else \
    "live" if "--live-generator" in sys.argv else "none"
code = 0
with tempfile.TemporaryDirectory() as d:
    for mode in ("run", "resume"):
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               "--nproc-per-node", "2", __file__, "--worker", mode, d, variant],
                              capture_output=True, text=True,
                              timeout=60)   # 5 s alone on 2 busy cores; 12x for load
        if done.returncode:
            print(done.stdout, done.stderr)
            sys.exit(2)
    for rank in (0, 1):
        run = json.loads((Path(d) / f"run-{rank}.json").read_text())
        resumed = json.loads((Path(d) / f"resume-{rank}.json").read_text())["resumed"]
        rest, head = run["1"][4:], run["1"][:4]
        print(f"rank {rank}: epoch 1 {run['1']}; resumed after batch 1: {resumed}")
        if resumed != rest:
            which = "epoch 0's" if resumed == run["0"][4:] else "another"
            print(f"  {which} order, not epoch 1's: {sorted(set(resumed) & set(head))} again, "
                  f"{sorted(set(rest) - set(resumed))} never")
            code = 1
sys.exit(code)
