"""huggingface/accelerate#4071 without the harness: one process, a shuffled loader prepared with
``use_seedable_sampler=True``. The uninterrupted run lists epoch 1's order; the resume does what
a mid-epoch resume does, ``set_epoch(1)`` then ``skip_first_batches(loader, 2)``, and lists what
it trains on. Exits 1 when that is not the rest of epoch 1 (the bug: epoch 0's order), or 0.

On accelerate 1.15.0 the bug is 1.14.0's constructor put back (the skipped loader's
``iteration`` set to 0); on 1.14.0 or older it is the library as it is, and ``--fixed`` applies
#4071 (the loader's ``iteration`` carried over)."""
import sys

import accelerate
import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from packaging.version import Version

fixed = "--fixed" in sys.argv
has_fix = Version(accelerate.__version__) >= Version("1.15.0")
accelerator = Accelerator(cpu=True,
                          dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
set_seed(0)
loader = accelerator.prepare(torch.utils.data.DataLoader(list(range(16)), batch_size=2,
                                                         shuffle=True))


def epoch(e: int) -> list[int]:
    loader.set_epoch(e)
    return [i for batch in loader for i in batch.tolist()]


orders = [epoch(0), epoch(1)]
print(f"accelerate {accelerate.__version__}; uninterrupted: epoch 0 {orders[0]}, "
      f"epoch 1 {orders[1]}")
loader.set_epoch(1)                                   # resuming at batch 2 of epoch 1
skipped = accelerator.skip_first_batches(loader, 2)
if fixed and not has_fix:
    skipped.iteration = loader.iteration              # #4071
elif not fixed and has_fix:
    skipped.iteration = 0                             # as accelerate 1.14.0 builds it
resumed = [i for batch in skipped for i in batch.tolist()]
print(f"resumed epoch 1 from batch 2: {resumed}; uninterrupted: {orders[1][4:]}")
if resumed == orders[1][4:]:
    sys.exit(0)
print(f"the resume trains epoch {0 if resumed == orders[0][4:] else '?'}'s order as epoch 1: "
      f"{sorted(set(resumed) & set(orders[1][:4]))} again, {sorted(set(orders[1][4:]) - set(resumed))} "
      "never")
sys.exit(1)
