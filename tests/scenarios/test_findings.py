"""The record (``findings/``): for every entry, the harness fails the bug with the named checker,
passes the fix on every checker, and the harness-free reproduction shows the bug and its fix.

Every test here is ``nightly`` (the nightly workflow runs them): an entry costs four harness runs
with their clean references, and a reproduction that needs two processes starts them itself."""
import subprocess
import sys

import pytest

from findings import Finding, catalog

CATALOG = catalog()
SLUGS = sorted(CATALOG)


def _run(reshard_run, f: Finding, args: tuple[str, ...]):
    return reshard_run(str(f.folder / "train.py"), args=[*f.args, *args], faults=f.faults(),
                       world_size=f.world_size, steps=f.steps)


@pytest.mark.nightly
@pytest.mark.parametrize("slug", SLUGS)
def test_the_harness_names_the_bug(reshard_run, slug):
    f = CATALOG[slug]
    verdict = _run(reshard_run, f, ()).verdicts[f.checker]
    assert verdict.status == "fail" and f.message in verdict.message, verdict


@pytest.mark.nightly
@pytest.mark.parametrize("slug", SLUGS)
def test_the_fix_passes_every_checker(reshard_run, slug):
    f = CATALOG[slug]
    _run(reshard_run, f, f.fixed_args).assert_ok()


@pytest.mark.nightly
@pytest.mark.parametrize("slug", SLUGS)
def test_the_reproduction_shows_it_without_the_harness(slug):
    script = CATALOG[slug].folder / "reproduce.py"
    for args, code in (((), 1), (CATALOG[slug].fixed_args, 0)):
        done = subprocess.run([sys.executable, str(script), *args], capture_output=True,
                              text=True, timeout=420)   # past each script's own bound
        assert done.returncode == code, f"{script} {' '.join(args)}: {done.stdout}{done.stderr}"
