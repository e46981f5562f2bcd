"""Record mode's cost per training step on a real (small, CPU) step, in one run.

The same step (an MLP's forward, backward and SGD update on one process) with the probe off and
with record mode on (``RESHARD_RECORD``: begin, a samples record, three points, a loss record,
end: seven events per step written to a real file), in alternating rounds; prints each median
step time and the ratio. The smaller the model, the larger the ratio: ``--hidden`` sets it.

Usage: python bench/record_overhead.py [--hidden 256] [--steps 300] [--rounds 5]
"""
import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from pytest_reshard.probe import Run


def rounds(run: Run, model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
           steps: int, first: int) -> float:
    ids = list(range(x.shape[0]))
    start = time.perf_counter()
    for step in range(first, first + steps):
        with run.step(step) as s:
            s.record(samples=ids)
            s.point("forward")
            loss = model(x).square().mean()
            s.point("backward")
            opt.zero_grad()
            loss.backward()
            s.point("optimizer")
            opt.step()
            s.record(loss=loss.item())
    return (time.perf_counter() - start) / steps


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, args.hidden))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(32, args.hidden)
    with tempfile.TemporaryDirectory() as tmp:
        off = Run({"RANK": "0", "WORLD_SIZE": "1"})
        on = Run({"RESHARD_RECORD": str(Path(tmp) / "rec"), "RANK": "0", "WORLD_SIZE": "1"})
        assert on.recording is not None and not off.active
        rounds(off, model, opt, x, args.steps, 0)   # warm-up
        times: dict[str, list[float]] = {"off": [], "record": []}
        for r in range(args.rounds):
            times["off"].append(rounds(off, model, opt, x, args.steps, r * args.steps))
            times["record"].append(rounds(on, model, opt, x, args.steps, r * args.steps))
        on.close()
    off_s, on_s = statistics.median(times["off"]), statistics.median(times["record"])
    print(f"hidden {args.hidden}: step {off_s * 1e6:.1f} us probe off, {on_s * 1e6:.1f} us "
          f"recording ({(on_s - off_s) * 1e6:+.1f} us, ratio {on_s / off_s:.3f})")


if __name__ == "__main__":
    main()
