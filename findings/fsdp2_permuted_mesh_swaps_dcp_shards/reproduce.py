"""FSDP2 + DCP on a permuted device mesh without the harness: two gloo processes (started here,
loopback) train a small FSDP2 model one step on the mesh ``[0, 1]`` and save it with ``dcp.save``;
then they build the same model on the mesh ``[1, 0]`` (the ranks listed in another order, as a
topology-aware placement does after a move) and ``dcp.load`` the checkpoint into it. In torch 2.13
``fully_shard`` cuts each parameter by process-group rank (ascending), while DCP places a shard by
its mesh coordinate, so the loaded model's full weights have their two halves swapped, with no
error. Exits 1 when the loaded model is not the saved one (the bug), or 0 with ``--fixed``: the
model loaded onto the mesh in ascending rank order, as saved."""
import os
import queue
import socket
import sys
import tempfile
from datetime import timedelta

import torch
import torch.multiprocessing as mp

WORLD = 2


def plain() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def model_on(mesh) -> torch.nn.Sequential:
    from torch.distributed.fsdp import fully_shard

    model = plain()
    for layer in (model[0], model[2], model):
        fully_shard(layer, mesh=mesh)
    return model


def full(model) -> dict[str, torch.Tensor]:
    return {k: v.full_tensor().clone() for k, v in model.state_dict().items()}


def rank_main(rank: int, port: int, folder: str, order: list[int], out) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    model = model_on(init_device_mesh("cpu", (WORLD,)))
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    x = torch.arange(8.0).reshape(2, 4) + rank
    ((model(x) - x) ** 2).mean().backward()
    opt.step()
    saved = full(model)
    dcp.save(get_model_state_dict(model), checkpoint_id=folder)

    mesh = DeviceMesh("cpu", torch.tensor(order))
    again = model_on(mesh)
    initial = plain().state_dict()   # a fresh model on this mesh gathers right: training looks fine
    fresh = all(torch.equal(v, initial[k]) for k, v in full(again).items())
    state = get_model_state_dict(again)
    dcp.load(state, checkpoint_id=folder)
    set_model_state_dict(again, state)
    loaded = full(again)
    wrong = [k for k in saved if not torch.equal(saved[k], loaded[k])]
    if rank == 0:
        w, v = saved["0.weight"], loaded["0.weight"]
        swapped = torch.equal(v, torch.cat([w[8:], w[:8]]))
        out.put((mesh.mesh.tolist(), fresh, wrong, swapped))
    dist.destroy_process_group()


def main() -> int:
    fixed = "--fixed" in sys.argv
    order = list(range(WORLD)) if fixed else list(reversed(range(WORLD)))
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as folder:
        procs = [ctx.Process(target=rank_main, args=(r, port, folder, order, out))
                 for r in range(WORLD)]
        for p in procs:
            p.start()
        try:
            mesh, fresh, wrong, swapped = out.get(timeout=90)
        except queue.Empty:
            mesh = None
        for p in procs:
            p.join(timeout=30)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    if mesh is None or any(p.exitcode != 0 for p in procs):
        print(f"the ranks did not finish (exit codes {[p.exitcode for p in procs]})")
        return 2
    print(f"torch {torch.__version__}: saved on the mesh [0, 1], loaded onto the mesh {mesh}; "
          f"before the load, a fresh model on it gathers to its initial weights: {fresh}")
    if wrong:
        print(f"dcp.load raised nothing, but the loaded {', '.join(wrong)} differ from what was "
              "saved" + ("; 0.weight holds the saved rows 8..15 then 0..7: its shards are "
                         "swapped" if swapped else ""))
        return 1
    print("every parameter is what was saved")
    return 0


if __name__ == "__main__":
    sys.exit(main())
