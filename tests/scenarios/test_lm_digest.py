"""The LM's cheap state digest is the full-state digest, bit for bit, at real world sizes.

``sharded_state_digest`` (two collectives) must return exactly what ``full_state_digest`` (one
gather per tensor) returns for the same state: state_equivalence compares digests taken at
different world sizes and by both paths (a load digest against the digest of a state rebuilt from
emergency snapshots). And ``init_adam_state`` must make the state ``get_state_dict``'s zero-grad
step makes, up to the step count a load overwrites. Real gloo processes; no timing asserted.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

RANK_SCRIPT = textwrap.dedent('''
    import json, os, sys
    from datetime import timedelta
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from pytest_reshard.fixtures import _common as C
    from pytest_reshard.fixtures import lm

    replicas, order = int(sys.argv[1]), json.loads(sys.argv[2])
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    shape = (replicas, world // replicas)
    if order:  # a permuted device mesh, as lm --bug permuted_mesh builds it
        mesh = DeviceMesh("cpu", torch.tensor(order).reshape(shape), mesh_dim_names=("r", "s"))
    else:
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=("r", "s"))

    def build():
        torch.manual_seed(0)
        model = lm.GPT(lm.SIZES["tiny"])
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)

    model, opt = build()
    g = torch.Generator().manual_seed(rank)
    for _ in range(2):
        tokens = torch.randint(0, 256, (2, 17), generator=g)
        logits = model(tokens[:, :-1])
        torch.nn.functional.cross_entropy(logits.reshape(-1, 256), tokens[:, 1:].reshape(-1)).backward()
        opt.step()
        opt.zero_grad()
    extra = {"lr_scheduler": {"x": 1}, "data": {"epoch": 0}, "rng": torch.get_rng_state()}
    old = C.full_state_digest(model, opt, 2, extra)
    msd, osd = get_state_dict(model, opt)
    new = C.sharded_state_digest(msd, osd, 2, extra)

    def layout(o):  # structure, dtypes, global and local shapes, placements of a state dict
        if isinstance(o, dict):
            return {str(k): layout(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [layout(v) for v in o]
        if isinstance(o, DTensor):
            return ["dtensor", str(o.dtype), list(o.shape), list(o.to_local().shape),
                    [str(p) for p in o.placements], o.requires_grad]
        if isinstance(o, torch.Tensor):
            return ["tensor", str(o.dtype), list(o.shape), str(o.device), o.requires_grad]
        return repr(o)

    def zero_step(m, o):  # what get_state_dict makes of an optimizer with no state
        _, sd = get_state_dict(m, o)
        return layout(sd)

    m1, o1 = build()
    by_step = zero_step(m1, o1)
    m2, o2 = build()
    made = C.init_adam_state(o2)
    by_init = layout(get_state_dict(m2, o2)[1])
    steps = sorted({float(s["step"]) for s in o2.state.values()})
    zeros = all(float(v.to_local().abs().sum()) == 0 for s in o2.state.values()
                for k, v in s.items() if k != "step")
    if rank == 0:
        print("RESULT " + json.dumps({"old": old, "new": new, "made": made, "steps": steps,
                                      "zeros": zeros, "same_layout": by_step == by_init}))
    dist.destroy_process_group()
''')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(tmp_path: Path, world: int, replicas: int, order: list[int]) -> dict:
    script = tmp_path / "digest_rank.py"
    script.write_text(RANK_SCRIPT)
    port = _free_port()
    procs = []
    try:
        for rank in range(world):
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
            procs.append(subprocess.Popen([sys.executable, str(script), str(replicas), json.dumps(order)],
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True, start_new_session=True))
        outs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {rank} exited {p.returncode}:\n{out[-3000:]}"
    line = next(l for l in outs[0].splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.mark.parametrize("world,replicas,order", [
    (3, 1, []),             # uneven shards (vocab 256 over 3)
    (4, 2, []),             # HSDP: 2 replicas x 2 shards
    pytest.param(2, 1, [1, 0],  # a permuted mesh, even shards: the bytes move with the coordinates
                 marks=pytest.mark.nightly),   # the CI budget: the uneven permutation stays
    (3, 1, [2, 0, 1]),      # a permuted mesh, uneven shards: the per-tensor gather's answer
], ids=["3-uneven", "hsdp-2x2", "permuted-even", "permuted-uneven"])
def test_the_sharded_digest_is_the_full_state_digest(tmp_path, world, replicas, order):
    r = _run_ranks(tmp_path, world, replicas, order)
    assert r["new"] == r["old"]
    assert set(r["new"]) == {"model", "optimizer", "step", "lr_scheduler", "data", "rng"}
    # init_adam_state: the state a zero-grad step makes (layout, zero moments), at step 0.
    assert r["made"] and r["same_layout"] and r["zeros"] and r["steps"] == [0.0]
