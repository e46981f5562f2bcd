"""huggingface/datasets#8308 without the harness, in one process: an IterableDataset of 64 rows
(4 shards, this process's half of them by ``split_dataset_by_node``: rows 0-15 and 32-47, so
after row 15 the stream goes on at 32) read through torchdata's
StatefulDataLoader, 2 rows a batch. Three jobs of 3 batches each; the second and the third start
from the state the one before saved. datasets 5.0.0 resumes the second job correctly, but its
``state_dict()`` stays at the start, so the third job reads the first job's batches again. The
installed datasets has 5.0.1's fix, so the bug is shown with 5.0.0's resume in a subclass (the
installed code, without the line that re-points the dataset's state at the live one). Exits 1
when the third job does not continue where the second stopped (the bug), or 0 with ``--fixed``
(the installed datasets as it is)."""
import sys

from datasets import Dataset, IterableDataset
from datasets.distributed import split_dataset_by_node
from torchdata.stateful_dataloader import StatefulDataLoader

fixed = "--fixed" in sys.argv


class Datasets500IterableDataset(IterableDataset):
    def _prepare_ex_iterable_for_iteration(self, batch_size=1, drop_last_batch=False):
        starting, self._starting_state_dict = self._starting_state_dict, None
        try:
            ex_iterable = super()._prepare_ex_iterable_for_iteration(batch_size, drop_last_batch)
        finally:
            self._starting_state_dict = starting
        if starting and self.epoch == starting["epoch"]:
            ex_iterable.load_state_dict(starting["examples_iterable"])  # 5.0.0 stops here
        return ex_iterable


def job(state: dict | None) -> tuple[list[list[int]], dict]:
    """A job that starts from ``state`` (if any), takes 3 batches and returns them with the
    loader's state_dict() to save."""
    stream = split_dataset_by_node(
        Dataset.from_dict({"sample_id": list(range(64))}).to_iterable_dataset(num_shards=4),
        rank=0, world_size=2).with_format("torch")
    if not fixed:
        stream.__class__ = Datasets500IterableDataset
    loader = StatefulDataLoader(stream, batch_size=2)
    if state is not None:
        loader.load_state_dict(state)
    batches = iter(loader)
    taken = [next(batches)["sample_id"].tolist() for _ in range(3)]
    return taken, loader.state_dict()


first, state = job(None)
second, state = job(state)
print(f"first job: {first}; resumed once: {second}")
print(f"the state the resumed job saves: {state['dataset_state']['examples_iterable']}")
third, _ = job(state)
print(f"resumed twice: {third}")
seen = {i for batch in first + second for i in batch}
again = sorted(i for batch in third for i in batch if i in seen)
if again:
    print(f"the second resume reads samples {again} again: the stream restarted")
    sys.exit(1)
sys.exit(0)
