"""PrimeIntellect-ai/prime-rl#3332 without the harness: one process, a torchdata
StatefulDataLoader with one worker. A first run takes 3 batches and saves the loader's state; the
resume builds a new loader, calls ``iter()`` on it, then loads the state (prime-rl's order before
#3332), and takes 2 batches. Exits 1 when they are not batches 4 and 5 of the uninterrupted run
(the bug: batches 1 and 2 again), or 0 with ``--fixed`` (the state loaded before ``iter()``)."""
import sys

from torchdata.stateful_dataloader import StatefulDataLoader

fixed = "--fixed" in sys.argv


def build() -> StatefulDataLoader:
    return StatefulDataLoader(list(range(16)), batch_size=2, num_workers=1)


loader = build()
first = iter(loader)
seen = [next(first).tolist() for _ in range(3)]
state = loader.state_dict()
rest = [next(first).tolist() for _ in range(2)]
print(f"uninterrupted: {seen} then {rest}")
loader = build()
if fixed:
    loader.load_state_dict(state)
    batches = iter(loader)
else:
    batches = iter(loader)               # before the load: the worker starts at row 0
    loader.load_state_dict(state)
resumed = [next(batches).tolist() for _ in range(2)]
print(f"resumed after 3 batches: {resumed}")
if resumed == rest:
    sys.exit(0)
print(f"the resume trains {[b for b in resumed if b in seen]} again")
print(f"and its state_dict() is still the loaded one: {loader.state_dict() == state}")
sys.exit(1)
