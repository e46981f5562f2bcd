"""Lightning-AI/litgpt#1712 without the harness: one process, 8 samples, 4 batches an epoch. A
run is stopped after batch 2 of epoch 1 with the loader's state saved, and resumed as litgpt's
pretrain.py does (the loader's state loaded, then ``CycleIterator`` built over it). Prints the
(epoch, batch) the resume trains for 8 batches, and exits 1 when that is not what the
uninterrupted run trains (the bug: the tail of epoch 1 again and again, epochs counted from 0),
or 0 with ``--fixed`` (the restored state used once, the CycleIterator's epoch restored)."""
import sys

fixed = "--fixed" in sys.argv


class StreamingLoader:   # litdata's StreamingDataLoader before #316's fix, reduced
    def __init__(self):
        self.epoch, self.batches, self.restored = 0, 0, None

    def state_dict(self):
        return {"epoch": self.epoch, "batches": self.batches}

    def load_state_dict(self, state):
        self.restored = dict(state)

    def __iter__(self):
        start = 0
        if self.restored is not None:
            self.epoch, start = self.restored["epoch"], self.restored["batches"]
            if fixed:
                self.restored = None
        for b in range(start, 4):
            self.batches = b + 1
            yield [2 * b, 2 * b + 1]
        self.epoch, self.batches = self.epoch + 1, 0


class CycleIterator:     # litgpt.utils.CycleIterator
    def __init__(self, iterable):
        self.iterable, self.epoch, self._iterator = iterable, 0, None

    def __next__(self):
        if self._iterator is None:
            self._iterator = iter(self.iterable)
        try:
            return next(self._iterator)
        except StopIteration:
            self._iterator = iter(self.iterable)
            self.epoch += 1
            return next(self._iterator)


def take(it, n):
    out = []
    for _ in range(n):
        ids = next(it)
        out.append((it.epoch, *ids))
    return out


clean = take(CycleIterator(StreamingLoader()), 14)
first = StreamingLoader()
stopped = CycleIterator(first)
take(stopped, 6)                                   # epoch 0, then batches 0-1 of epoch 1
saved = {"train_dataloader": first.state_dict(), "cycle_epoch": stopped.epoch}
loader = StreamingLoader()
loader.load_state_dict(saved["train_dataloader"])
resumed = CycleIterator(loader)                    # after the load, as pretrain.py does
if fixed:
    resumed.epoch = saved["cycle_epoch"]           # litgpt PR #2313
got = take(resumed, 8)
print(f"uninterrupted (epoch, ids): {clean[6:]}")
print(f"resumed       (epoch, ids): {got}")
if got == clean[6:]:
    sys.exit(0)
seen = sorted({i for _, *ids in got for i in ids})
print(f"the resume trains only samples {seen} (the tail of epoch 1) in every epoch, with "
      f"epochs counted from {got[0][0]} (saved in epoch {saved['cycle_epoch']})")
sys.exit(1)
