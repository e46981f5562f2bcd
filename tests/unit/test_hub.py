"""The hub's pure parts: the challenge's answer, the names of what it refuses, and how what it
kept out reaches the verdict's words (the hub itself, on real sockets: tests/scenarios/test_hub.py)."""
from __future__ import annotations

import hashlib
import hmac

import pytest

from pytest_reshard.checkers.liveness import liveness
from pytest_reshard.contract import HUB_PROTOCOL, SUPERVISOR_EVENTS, Ev, Refusal, hub_mac
from pytest_reshard.supervisor import hub
from tests.histories import Builder


def test_the_answer_is_the_hmac_of_the_nonce_and_the_hello_line_under_the_run_secret():
    hello = b'{"hello":"rank","protocol":2,"gen":0,"rank":1}'
    assert hub_mac("s3cret", "abcd", hello) == hmac.new(b"s3cret", b"abcd" + hello,
                                                         hashlib.sha256).hexdigest()
    # any change to the secret, the nonce or the hello changes the answer
    assert len({hub_mac("s3cret", "abcd", hello), hub_mac("s3cres", "abcd", hello),
                hub_mac("s3cret", "abce", hello), hub_mac("s3cret", "abcd", hello + b" ")}) == 4


def test_the_protocol_with_a_challenge_is_a_new_protocol_and_its_record_a_supervisor_event():
    assert HUB_PROTOCOL >= 2  # a peer of the version before (no challenge) is refused by name
    assert Ev.HUB in SUPERVISOR_EVENTS
    assert str(Refusal.BAD_CREDENTIALS) == "bad credentials"


def test_the_bounds_are_named_and_sane():
    assert hub.MAX_HELLO_LINE < hub.MAX_LINE
    assert 0 < hub.MAX_PENDING <= hub.MAX_CONNECTIONS
    assert hub.HELLO_DEADLINE_S > 1


@pytest.mark.parametrize("host", ["", "0.0.0.0", "::"])
def test_the_hub_never_binds_every_interface(tmp_path, host):
    from pytest_reshard.contract import RunDir

    with pytest.raises(ValueError, match="binds to the one address its ranks reach"):
        hub.Hub(RunDir(tmp_path), host)


def _kept_out(refused=(), dropped=()):
    """A clean run of 20 steps whose hub kept out ``refused`` connections and ``dropped`` lines."""
    b = Builder(steps=20, world_size=2)
    b.gen(run=range(20))
    b.sup(Ev.HUB, launcher="slurm", hub="10.77.3.1:4242", refused=list(refused),
          dropped=list(dropped))
    return b.history()


def test_refused_connections_are_named_in_the_verdict_and_leave_a_pass_a_pass():
    """They never reached the history, so the verdict on the workload stands; the words say who
    knocked, why it was turned away, and from where."""
    h = _kept_out(refused=[
        {"reason": Refusal.BAD_CREDENTIALS.value, "count": 3, "hosts": ["10.77.3.2"]},
        {"reason": Refusal.SLOW.value, "count": 1, "hosts": ["10.77.3.9"]}])
    v = liveness(h)
    assert v.status == "pass"
    assert "3 connections refused: bad credentials, from 10.77.3.2" in v.message
    assert "1 connection refused: no hello in time, from 10.77.3.9" in v.message
    assert h.hub_kept_out()[0][0] == "3 connections refused: bad credentials, from 10.77.3.2"


def test_a_dropped_line_of_a_trusted_rank_turns_a_pass_into_unknown_naming_the_rank():
    h = _kept_out(dropped=[
        {"reason": Refusal.TOO_LONG.value, "count": 1, "hosts": ["10.77.3.2"],
         "peer": "rank 1 of generation 0"}])
    v = liveness(h)
    assert v.status == "unknown"
    assert "1 line of rank 1 of generation 0 (from 10.77.3.2) dropped: line too long" in v.message
