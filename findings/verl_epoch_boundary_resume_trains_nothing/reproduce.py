"""verl-project/verl#5725 without the harness (or verl): one process, verl's fit() arithmetic over
torchdata's StatefulDataLoader. 8 samples, 2 a step: 4 steps an epoch, 2 epochs, a save every 4
steps inside the batch loop. The run saves at global step 4 (epoch 0's last batch), then resumes
from it as fit() does: the loader's state loaded, ``current_epoch = global_steps //
steps_per_epoch``, ``for epoch in range(current_epoch, total_epochs)``. Exits 1 when the resume
trains fewer steps than the 4 left (the bug: 0), or 0 with ``--fixed`` (#5725: the state is not
loaded at an epoch boundary)."""
import sys

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

fixed = "--fixed" in sys.argv
TOTAL_EPOCHS, SAVE_FREQ = 2, 4


def build() -> StatefulDataLoader:
    return StatefulDataLoader(list(range(8)), batch_size=2, drop_last=True, shuffle=True,
                              generator=torch.Generator().manual_seed(0))


def fit(loader: StatefulDataLoader, global_steps: int, stop_at: int | None = None):
    """verl's loop: returns the global step it ended at, the state it saved, the batches."""
    saved, trained = None, []
    for _epoch in range(global_steps // len(loader), TOTAL_EPOCHS):
        for batch in loader:
            trained.append(batch.tolist())
            global_steps += 1
            if global_steps % SAVE_FREQ == 0:
                saved = loader.state_dict()
            if global_steps == stop_at:
                return global_steps, saved, trained
    return global_steps, saved, trained


steps_per_epoch = len(build())
total = TOTAL_EPOCHS * steps_per_epoch
done, state, _ = fit(build(), 0, stop_at=5)           # dies during global step 5
print(f"saved at global step {SAVE_FREQ} (steps_per_epoch {steps_per_epoch}): "
      f"{ {k: v for k, v in state.items() if 'yielded' in k} }")
loader = build()
if not (fixed and SAVE_FREQ % steps_per_epoch == 0):
    loader.load_state_dict(state)
end, _, trained = fit(loader, SAVE_FREQ)
print(f"resumed at global step {SAVE_FREQ}: trained {len(trained)} steps {trained}, ended at "
      f"global step {end} of {total}")
if end == total:
    sys.exit(0)
print(f"the resume ended {total - end} steps short, and exited normally")
sys.exit(1)
