"""A user's data-parallel script whose steps are compute-bound: each rank multiplies matrices for
a fixed amount of work, then all-reduces. It records, per step, the seconds it computed
(``compute_s``) and the seconds it waited at the all-reduce for the others (``wait_s``): on a
heterogeneous world the slow class computes longer, and the fast one waits for it."""
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from pytest_reshard import probe

run = probe.attach()
dist.init_process_group("gloo", timeout=timedelta(seconds=30))
torch.manual_seed(0)
a = torch.randn(192, 192)
steps = int(os.environ.get("RESHARD_STEPS", 8))
for step in range(steps):
    with run.step(step) as s:
        s.record(samples=[step * dist.get_world_size() + dist.get_rank()])
        t0 = time.perf_counter()
        x = a
        for _ in range(300):
            x = torch.tanh(x @ a)
        t1 = time.perf_counter()
        total = x.sum().reshape(1)
        dist.all_reduce(total)
        s.record(loss=float(total) / dist.get_world_size(), compute_s=round(t1 - t0, 6),
                 wait_s=round(time.perf_counter() - t1, 6))
run.close()
dist.destroy_process_group()
