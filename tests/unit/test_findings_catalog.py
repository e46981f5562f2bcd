"""The record's shape, checked on every PR (its runs are nightly): every entry loads, names a
checker that exists, and has its script and its reproduction."""
import pytest

from findings import catalog
from pytest_reshard.checkers import registry

CATALOG = catalog()


def test_the_catalogue_has_entries():
    assert len(CATALOG) >= 20, sorted(CATALOG)


@pytest.mark.parametrize("slug", sorted(CATALOG))
def test_an_entry_is_complete(slug):
    f = CATALOG[slug]
    assert (f.folder / "train.py").is_file() and (f.folder / "reproduce.py").is_file(), slug
    assert registry.get(f.checker) is not None, f"{slug}: no checker {f.checker!r}"
    assert "#" in f.upstream or f.upstream.startswith("unreported: "), f"{slug}: {f.upstream!r}"
    assert f.message and f.affected and f.fixed and f.reproduced_with
    assert f.faults(), f"{slug}: a scenario with no fault shows nothing"
