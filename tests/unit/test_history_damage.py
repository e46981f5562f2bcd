"""Randomly damaged event files never turn a verdict into a pass that the intact files did not
earn: a changed line is caught by its checksum (or its JSON), and then nothing is judged.

Out of reach by construction: a file cut exactly at a line boundary, or a whole line removed,
reads as a rank that stopped writing there (as a SIGKILL leaves it) and is judged as such."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ..histories import DIGEST, Builder, reshard_run
from pytest_reshard.checkers import CheckContext, run_all
from pytest_reshard.history import History

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _runs() -> dict[str, Builder]:
    clean = Builder(steps=6)
    clean.gen(run=range(6))
    rewound = reshard_run(steps=10, at=6, resume=4, run=range(4, 10))   # replays steps 4..6
    wrong_state = reshard_run(steps=10, at=6, load=(6, {**DIGEST, "model": "other"}))
    return {"clean": clean, "reshard": reshard_run(steps=10, at=6),
            "rewound": rewound, "wrong_state": wrong_state}


RUNS = _runs()


def _statuses(history: History) -> dict[str, str]:
    return {name: v.status for name, v in run_all(CheckContext(history)).items()}


@pytest.fixture(scope="module")
def intact(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, str]]]:
    out = {}
    for name, b in RUNS.items():
        folder = b.write(tmp_path_factory.mktemp(name))
        out[name] = (folder, _statuses(History.load(folder)))
    return out


def test_one_byte_that_would_turn_a_fail_into_a_pass_is_caught(tmp_path: Path) -> None:
    """The resumed model's digest differs from the saved one by one byte; the same byte changed
    on disk would make the load look right. The checksum catches it: unknown, not pass."""
    folder = reshard_run(steps=10, at=6, load=(6, {**DIGEST, "model": "aaab"})).write(tmp_path)
    assert _statuses(History.load(folder))["state_equivalence"] == "fail"
    for path in (folder / "events").glob("g1-r0.jsonl"):
        path.write_bytes(path.read_bytes().replace(b'"model":"aaab"', b'"model":"aaaa"'))
    history = History.load(folder)
    assert len(history.damaged) == 1 and "checksum" in history.damaged[0].why
    assert _statuses(history)["state_equivalence"] == "unknown"


def test_the_intact_runs_pass_and_fail_as_built(intact) -> None:
    assert "fail" not in intact["clean"][1].values() and "pass" in intact["clean"][1].values()
    assert intact["rewound"][1]["no_rewind"] == "fail"
    assert intact["wrong_state"][1]["state_equivalence"] == "fail"


MUTATIONS = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 7), st.just(b"")),
    st.tuples(st.just("replace"), st.just(0), st.binary(min_size=1, max_size=1)),
    st.tuples(st.just("delete"), st.integers(1, 20), st.just(b"")),
    st.tuples(st.just("insert"), st.just(0), st.binary(min_size=1, max_size=20)),
    st.tuples(st.just("insert"), st.just(0), st.sampled_from([b"\n", b"{}\n", b'"\n', b"\x00"])))


def _mutate(data: bytes, at: int, how: tuple[str, int, bytes]) -> bytes:
    kind, n, blob = how
    if kind == "flip":
        return data[:at] + bytes([data[at] ^ (1 << n)]) + data[at + 1:]
    if kind == "replace":
        return data[:at] + blob + data[at + 1:]
    if kind == "delete":
        return data[:at] + data[at + n:]
    return data[:at] + blob + data[at:]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(run=st.sampled_from(sorted(RUNS)), which=st.integers(0, 10**6), where=st.floats(0, 1),
       how=MUTATIONS)
def test_damage_never_turns_a_verdict_into_an_unearned_pass(intact, tmp_path_factory, run, which,
                                                            where, how) -> None:
    folder, before = intact[run]
    copy = tmp_path_factory.mktemp("damaged") / "run"
    shutil.copytree(folder, copy)
    files = sorted((copy / "events").glob("*.jsonl"))
    path = files[which % len(files)]
    data = path.read_bytes()
    last = data.rstrip(b"\n").rfind(b"\n") + 1    # the last line stays whole (module docstring)
    if last == 0:
        return
    at = min(int(where * last), last - 1)
    how = (how[0], min(how[1], last - at), how[2]) if how[0] == "delete" else how
    path.write_bytes(_mutate(data, at, how))
    after = _statuses(History.load(copy))
    unearned = {name for name, status in after.items()
                if status == "pass" and before.get(name) != "pass"}
    assert not unearned, (path.name, at, how, before, after)


def test_a_damaged_clean_run_is_no_reference(tmp_path: Path) -> None:
    from pytest_reshard.checkers.context import _unfinished

    b = Builder(steps=4)
    b.gen(run=range(4))
    folder = b.write(tmp_path)
    path = folder / "events" / "g0-r0.jsonl"
    path.write_bytes(path.read_bytes().replace(b'"step":2,', b'"step":7,', 1))
    why = _unfinished(History.load(folder), "2 ranks")
    assert why is not None and "damaged at" in why and "g0-r0.jsonl" in why, why
