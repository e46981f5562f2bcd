"""What watching a rank's files costs: a training step and a checkpoint save, hook off vs on.

    .venv/bin/python bench/file_probe_overhead.py [--rounds 5]

Each measurement runs in a fresh interpreter (the audit hook cannot be removed once installed),
the "off" and "on" children alternating (and taking turns going first), so both see the same
machine load; medians of ``--rounds``. Measured:

- a step: forward + backward + AdamW of a small MLP, with the probe's begin/point/end events
  (the watcher sees no file event in a step; what it costs there is the audit hook's test of
  every audited event the interpreter raises);
- a save: ``torch.distributed.checkpoint.save`` (DCP, one rank, gloo) of that model and its
  optimizer into a fresh folder, and a ``torch.save`` of 64 MiB of tensors to a path (the native
  writer: the file is read back once for its CRC).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEPS = 200


def child(mode: str, folder: Path) -> dict[str, float]:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from pytest_reshard import filewatch

    if mode == "on":
        filewatch.install(folder, lambda **fields: None, lambda: 0)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 256))
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(32, 256)
    for _ in range(20):      # warm up
        model(x).square().mean().backward()
    t0 = time.perf_counter()
    for _ in range(STEPS):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    step_s = (time.perf_counter() - t0) / STEPS
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29000 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    dcp.save(state, checkpoint_id=folder / "warm")
    t0 = time.perf_counter()
    dcp.save(state, checkpoint_id=folder / "dcp")
    dcp_s = time.perf_counter() - t0
    big = {f"t{i}": torch.randn(1024, 1024) for i in range(16)}   # 64 MiB
    t0 = time.perf_counter()
    torch.save(big, folder / "big.pt")
    native_s = time.perf_counter() - t0
    dist.destroy_process_group()
    return {"step_s": step_s, "dcp_save_s": dcp_s, "torch_save_64mib_s": native_s}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--child", choices=["off", "on"])
    p.add_argument("--folder")
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.child, Path(a.folder))))
        return
    got: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    for i in range(a.rounds):
        for mode in (("off", "on") if i % 2 == 0 else ("on", "off")):  # neither always first
            with tempfile.TemporaryDirectory() as folder:
                out = subprocess.run([sys.executable, __file__, "--child", mode, "--folder",
                                      folder], capture_output=True, text=True, check=True,
                                     timeout=600)
                got[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"medians of {a.rounds} alternating runs each, fresh interpreters")
    print(f"{'figure':24} {'hook off':>10} {'hook on':>10} {'on/off':>7}")
    for key in got["off"][0]:
        off = statistics.median(r[key] for r in got["off"])
        on = statistics.median(r[key] for r in got["on"])
        print(f"{key:24} {off * 1e3:8.2f}ms {on * 1e3:8.2f}ms {on / off:7.3f}")


if __name__ == "__main__":
    main()
