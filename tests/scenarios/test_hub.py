"""The hub on a real socket against peers that are not the harness's: forged, replayed, slow,
oversized, malformed and random ones, beside real rank processes that must carry on.

What every test asserts in the end: the hub still serves (a rank with the run's secret gets its
plan), it counts each peer it turned away with the reason and the address, and nothing a peer
without the secret sent reaches the run folder. The fuzz tests (Hypothesis) keep to a budget a
CI run affords: ``FUZZ_EXAMPLES`` examples each, a few seconds in all.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_reshard.contract import (HUB_PROTOCOL, Env, Ev, Refusal, RunDir, hub_hello, hub_line,
                                     hub_mac, read_jsonl)
from pytest_reshard.supervisor.hub import MAX_HELLO_LINE, Hub

#: Examples per fuzz test: each is one connection or a few, a few ms on a loaded machine.
FUZZ_EXAMPLES = 60
FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])
#: Every wait on the hub is bounded by this (it answers in ms; a loaded CI machine is slower).
WAIT_S = 30.0
PLAN = {"seed": 1234, "world_size": 64, "roles": ["trainer"] * 64, "device_map": None,
        "faults": [], "files": False}


def _until(done, what: str, timeout: float = WAIT_S, state=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f} s {state()}"
        time.sleep(0.005)


@contextlib.contextmanager
def _hub(tmp_path: Path, **bounds) -> Iterator[Hub]:
    run = RunDir(tmp_path / "run")
    run.events.mkdir(parents=True, exist_ok=True)
    run.plan(0).write_text(json.dumps(PLAN))
    h = Hub(run, "127.0.0.1", **bounds)
    try:
        yield h
    finally:
        h.close()


@pytest.fixture
def hub(tmp_path):
    with _hub(tmp_path) as h:
        yield h


def _connect(hub: Hub) -> socket.socket:
    host, port = hub.address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=WAIT_S)


def _hello(rank: int = 0, gen: int = 0, **extra) -> dict:
    return {"hello": "rank", "protocol": HUB_PROTOCOL, "gen": gen, "rank": rank, "pid": 1,
            "t": time.time(), **extra}


def _event(rank: int, step: int, gen: int = 0) -> bytes:
    return json.dumps({"ev": "begin", "t": time.time(), "gen": gen, "rank": rank,
                       "step": step}).encode() + b"\n"


def _closed_by_hub(s: socket.socket) -> bool:
    """The hub closed this connection (an end of file, or a reset when it left bytes unread)."""
    try:
        return s.recv(1 << 16) == b""
    except ConnectionResetError:
        return True


def _refused(hub: Hub) -> int:
    return sum(hub.counts()[0].values())


def _reasons(hub: Hub) -> dict[Refusal, int]:
    out: dict[Refusal, int] = {}
    for (reason, host, _), n in hub.counts()[0].items():
        assert host == "127.0.0.1"
        out[reason] = out.get(reason, 0) + n
    return out


def _trusted(hub: Hub, rank: int) -> socket.socket:
    """A peer with the run's secret, bound as ``rank`` of generation 0, its plan read."""
    s = _connect(hub)
    buf = hub_hello(s, _hello(rank), hub.secret, time.monotonic() + WAIT_S)
    assert json.loads(hub_line(s, buf, time.monotonic() + WAIT_S, "plan"))["seed"] == 1234
    return s


def _serves(hub: Hub, rank: int = 63) -> None:
    """The hub still serves: a trusted rank is bound, writes a line and ends."""
    with _trusted(hub, rank) as s:
        s.sendall(_event(rank, 0))
    _until(lambda: (0, rank) in hub.ended, "the trusted rank's end")
    hub.check()
    assert hub.pending() == 0


def _forged_lines(hub: Hub) -> list[str]:
    """Every events file in the run folder but the trusted ranks' (``_serves`` uses rank 63)."""
    return sorted(p.name for p in hub.dir.events.iterdir() if p.name != "g0-r63.jsonl")


def _send_and_close(hub: Hub, payload: bytes, *, read_nonce: bool = False) -> None:
    """One connection that sends ``payload`` and closes; returns once the hub counted it."""
    before = _refused(hub)
    with _connect(hub) as s:
        try:
            s.sendall(payload)
        except OSError:
            pass  # the hub closed it first (a line too long): that is the point
    _until(lambda: _refused(hub) == before + 1, "the hub counted the connection")


# -- the challenge ---------------------------------------------------------------------------
def test_a_forged_rank_with_the_protocol_but_no_secret_or_a_wrong_one_is_refused_and_named(hub):
    """It knows the protocol, says hello as rank 0 and goes on as a rank would: without an
    answer to the challenge (its events where the answer belongs) or with the answer under
    another secret, it is closed and counted, and its events are nowhere."""
    with _connect(hub) as s:
        s.sendall(json.dumps(_hello(0)).encode() + b"\n")
        assert "nonce" in json.loads(hub_line(s, bytearray(), time.monotonic() + WAIT_S, "nonce"))
        s.sendall(json.dumps({"ev": "end", "step": 99, "t": 0, "gen": 0, "rank": 0}).encode()
                  + b"\n")
        assert _closed_by_hub(s)
    for _ in range(3):
        with _connect(hub) as s:
            with pytest.raises(ConnectionError, match="refused this process"):
                buf = hub_hello(s, _hello(0), "not-the-secret", time.monotonic() + WAIT_S)
                hub_line(s, buf, time.monotonic() + WAIT_S, "plan")
    _until(lambda: _refused(hub) == 4, "four refusals")
    assert _reasons(hub) == {Refusal.NO_CREDENTIALS: 1, Refusal.BAD_CREDENTIALS: 3}
    assert hub.summary()["refused"] == [
        {"reason": "bad credentials", "count": 3, "hosts": ["127.0.0.1"]},
        {"reason": "no credentials", "count": 1, "hosts": ["127.0.0.1"]}]
    assert not hub.nodes and not hub.beats and _forged_lines(hub) == []
    _serves(hub)


def test_a_replayed_answer_is_worth_nothing_against_the_next_nonce(hub):
    """A peer that saw a trusted rank's whole hello (its line and its answer) sends both again:
    the hub's new nonce makes the old answer wrong, and nothing it sends after is written."""
    line = json.dumps(_hello(5), separators=(",", ":")).encode()
    with _connect(hub) as s:
        s.sendall(line + b"\n")
        buf = bytearray()
        nonce = json.loads(hub_line(s, buf, time.monotonic() + WAIT_S, "nonce"))["nonce"]
        captured = json.dumps({"mac": hub_mac(hub.secret, nonce, line)}).encode() + b"\n"
        s.sendall(captured)
        assert json.loads(hub_line(s, buf, time.monotonic() + WAIT_S, "plan"))["seed"] == 1234
        s.sendall(_event(5, 0))
    _until(lambda: (0, 5) in hub.ended, "the trusted rank's end")
    for _ in range(2):
        with _connect(hub) as s:
            s.sendall(line + b"\n")
            assert json.loads(hub_line(s, bytearray(), time.monotonic() + WAIT_S,
                                       "nonce"))["nonce"] != nonce
            s.sendall(captured + _event(5, 1) + _event(5, 2))
            assert _closed_by_hub(s)
    _until(lambda: _refused(hub) == 2, "two refusals")
    assert _reasons(hub) == {Refusal.BAD_CREDENTIALS: 2}
    events, _, _ = read_jsonl(hub.dir.rank_events(0, 5))
    assert [e["step"] for _, e in events] == [0]  # only what the trusted rank sent


def test_a_rank_process_without_the_secret_cannot_attach_and_says_why(tmp_path, hub):
    script = tmp_path / "rank.py"
    script.write_text("from pytest_reshard import probe\nprobe.attach()\n")
    base = {**os.environ, Env.DIR: str(tmp_path / "elsewhere"), Env.HUB: hub.address,
            Env.GENERATION: "0", "RANK": "0", "WORLD_SIZE": "1"}
    base.pop(Env.HUB_SECRET, None)
    for secret, said in ((None, f"{Env.HUB_SECRET} is not set"),
                         ("wrong", "closed the connection before sending the plan")):
        env = dict(base, **({Env.HUB_SECRET: secret} if secret else {}))
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode != 0 and said in done.stderr, done.stderr[-2000:]
    _until(lambda: _refused(hub) == 1, "the wrong secret refused")
    assert _reasons(hub) == {Refusal.BAD_CREDENTIALS: 1} and _forged_lines(hub) == []


def _listening(port: int) -> list[str]:
    """The local addresses listening on ``port`` on this machine (``/proc/net/tcp``, ``tcp6``)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            local, state = row.split()[1], row.split()[3]
            addr, _, hexport = local.rpartition(":")
            if state == "0A" and int(hexport, 16) == port:  # 0A: LISTEN
                found.append(addr)
    return found


def test_the_hub_and_the_stores_we_host_listen_on_one_address_only(hub):
    """Torch's store listens on every interface unless handed a bound socket; ours are, and a
    store's port is free again once it is gone."""
    import gc

    from pytest_reshard.supervisor.launch import host_store

    loopback = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it
    assert _listening(int(hub.address.rsplit(":", 1)[1])) == [loopback]
    store = host_store("127.0.0.1")
    port = store.port
    assert _listening(port) == [loopback]
    store.set("k", "v")
    del store
    gc.collect()
    _until(lambda: not _listening(port), "the store's port closed")


# -- bounds ----------------------------------------------------------------------------------
def test_silent_and_slow_peers_are_refused_at_the_hello_deadline(tmp_path):
    """One connects and says nothing, one dribbles a hello a byte at a time, one says hello and
    never answers the challenge: each holds a slot only until the deadline."""
    with _hub(tmp_path, hello_deadline_s=0.5) as hub:
        line = json.dumps(_hello(0)).encode() + b"\n"
        t0 = time.monotonic()
        with _connect(hub) as silent, _connect(hub) as slow, _connect(hub) as mute:
            mute.sendall(line)
            for byte in line:
                try:
                    slow.sendall(bytes([byte]))
                except OSError:
                    break
                if hub.pending() < 3:
                    break
                time.sleep(0.05)
            for s in (silent, slow, mute):
                s.settimeout(WAIT_S)
                while s.recv(1 << 16):
                    pass  # mute reads its nonce first; then the end of file
        # all three refused 0.50-0.53 s after connecting (load 2.4-5.9): the deadline's
        # doing (without it they would wait WAIT_S), 10x margin
        assert time.monotonic() - t0 < 0.5 + 5
        _until(lambda: _refused(hub) == 3, "three refusals")
        assert _reasons(hub) == {Refusal.SLOW: 3}
        _serves(hub)


def test_an_oversized_hello_is_refused_and_an_oversized_event_of_a_trusted_rank_dropped(tmp_path):
    """Before the challenge is answered a line is a few hundred bytes: more is refused at once.
    A trusted rank's line past the limit is dropped and named, the rank's next line is kept, its
    connection stays, and every other peer carries on."""
    with _hub(tmp_path, max_line=4096) as hub:
        _send_and_close(hub, b"x" * (MAX_HELLO_LINE + 10))
        _send_and_close(hub, b"{" * (2 * MAX_HELLO_LINE) + b"\n")
        assert _reasons(hub) == {Refusal.TOO_LONG: 2}
        with _trusted(hub, 7) as s, _trusted(hub, 8) as other:
            s.sendall(b'{"ev":"note","t":1,"what":"' + b"y" * 10_000)
            s.sendall(b'"}\n' + _event(7, 1))
            other.sendall(_event(8, 0))
            s.sendall(_event(7, 2))
            _until(lambda: len(read_jsonl(hub.dir.rank_events(0, 7))[0]) == 2, "rank 7's lines")
        _until(lambda: (0, 7) in hub.ended and (0, 8) in hub.ended, "both ends")
        assert [e["step"] for _, e in read_jsonl(hub.dir.rank_events(0, 7))[0]] == [1, 2]
        assert len(read_jsonl(hub.dir.rank_events(0, 8))[0]) == 1
        assert hub.summary()["dropped"] == [{"reason": "line too long", "count": 1,
                                             "hosts": ["127.0.0.1"],
                                             "peer": "rank 7 of generation 0"}]
        hub.check()


def test_malformed_lines_of_a_trusted_rank_are_dropped_one_by_one_and_named(hub):
    """Not JSON, not an object, a name that is not a string, a time that is not a number, an
    event that claims another rank: each is dropped (the history never reads it), the good
    lines between them are kept, and the hub goes on serving."""
    bad = [b"not json", b"[1, 2]", b'{"ev": 3, "t": 1}', b'{"ev": "begin", "t": "soon"}',
           b'{"ev": "begin", "t": NaN}', b'{"ev": "end", "t": 1, "gen": 0, "rank": 2}',
           b"\xff\xfe"]
    with _trusted(hub, 3) as s:
        for i, line in enumerate(bad):
            s.sendall(line + b"\n" + _event(3, i))
    _until(lambda: (0, 3) in hub.ended, "rank 3's end")
    assert [e["step"] for _, e in read_jsonl(hub.dir.rank_events(0, 3))[0]] == list(range(len(bad)))
    (group,) = hub.summary()["dropped"]
    assert group == {"reason": "malformed line", "count": len(bad), "hosts": ["127.0.0.1"],
                     "peer": "rank 3 of generation 0"}
    _serves(hub)


def test_malformed_and_foreign_hellos_are_refused_by_name(hub):
    for payload, reason in (
            (b"hello\n", Refusal.MALFORMED),
            (json.dumps(_hello(0, protocol=1)).encode() + b"\n", Refusal.PROTOCOL),
            (json.dumps(_hello(0, gen="0")).encode() + b"\n", Refusal.MALFORMED),
            (json.dumps(_hello(-1)).encode() + b"\n", Refusal.MALFORMED),
            (json.dumps({**_hello(0), "hello": "admin"}).encode() + b"\n", Refusal.MALFORMED),
            (json.dumps(_hello(0, t="now")).encode() + b"\n", Refusal.MALFORMED),
            (b"", Refusal.CLOSED),
            (json.dumps(_hello(0)).encode() + b"\n", Refusal.CLOSED)):  # closes before answering
        before = _reasons(hub).get(reason, 0)
        _send_and_close(hub, payload)
        assert _reasons(hub)[reason] == before + 1, payload
    assert not hub.nodes and _forged_lines(hub) == []
    _serves(hub)


def test_past_the_connection_limits_a_connection_is_refused_and_the_others_carry_on(tmp_path):
    with _hub(tmp_path, max_pending=3, max_connections=5) as hub:
        waiting = [_connect(hub) for _ in range(3)]
        _until(lambda: hub.pending() == 3, "three pending")
        _send_and_close(hub, b"")  # a fourth before any answered: refused at once
        assert _reasons(hub) == {Refusal.TOO_MANY: 1}
        for s in waiting:
            s.close()
        _until(lambda: hub.pending() == 0, "the pending ones closed")
        trusted = [_trusted(hub, r) for r in range(5)]  # five bound: the limit
        _send_and_close(hub, b"")
        assert _reasons(hub)[Refusal.TOO_MANY] == 2
        for r, s in enumerate(trusted):
            s.sendall(_event(r, 0))
            s.close()
        _until(lambda: all((0, r) in hub.ended for r in range(5)), "the five ends")
        _serves(hub)


def test_a_real_rank_carries_on_beside_forged_peers_and_its_history_is_whole(tmp_path, hub):
    """A rank process (the probe, over the hub) trains while forged peers knock: its events are
    all in its file, in order, and nothing else is in the run folder."""
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent("""
        import sys
        from pytest_reshard import probe
        run = probe.attach()
        print("attached", flush=True)
        for step in range(40):
            with run.step(step) as s:
                s.record(loss=1.0 / (step + 1), samples=[step])
        run.close()
    """))
    env = {**os.environ, Env.DIR: str(tmp_path / "elsewhere"), Env.HUB: hub.address,
           Env.HUB_SECRET: hub.secret, Env.GENERATION: "0", "RANK": "2", "WORLD_SIZE": "64"}
    rank = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                            text=True)
    try:
        forged = 0
        while rank.poll() is None and forged < 30:
            _send_and_close(hub, json.dumps(_hello(2)).encode() + b"\n"
                            + b'{"mac": "00"}\n' + _event(2, 999))
            forged += 1
        assert rank.wait(timeout=120) == 0
    finally:
        rank.kill()
        rank.wait(timeout=30)
    _until(lambda: (0, 2) in hub.ended, "the rank's end")
    events, torn, _ = read_jsonl(hub.dir.rank_events(0, 2))
    steps = [e["step"] for _, e in events if e["ev"] == Ev.END]
    assert steps == list(range(40)) and not torn and 999 not in {e.get("step") for _, e in events}
    assert _reasons(hub) == {Refusal.BAD_CREDENTIALS: forged}
    assert sorted(p.name for p in hub.dir.events.iterdir()) == ["g0-r2.jsonl"]


# -- fuzzing ---------------------------------------------------------------------------------
def test_fuzz_random_bytes_never_reach_the_run_folder(tmp_path):
    """Any bytes at all, on a fresh connection: refused and counted, the hub serves on."""
    with _hub(tmp_path) as hub:
        @FUZZ
        @given(st.binary(max_size=2 * MAX_HELLO_LINE) | st.lists(
            st.binary(max_size=64), max_size=8).map(b"\n".join))
        def one(payload: bytes) -> None:
            _send_and_close(hub, payload)
            assert _forged_lines(hub) == [] and not hub.nodes and not hub.beats
        one()
        hub.check()
        _serves(hub)


_value = st.none() | st.booleans() | st.integers(-2, 1 << 40) | st.floats() | st.text(max_size=8) \
    | st.lists(st.integers(), max_size=2)


def test_fuzz_hellos_of_the_right_protocol_without_the_secret_bind_nothing(tmp_path):
    """Hellos of the right protocol as a rank or a node, with random fields, each line cut
    anywhere (a truncated line), answered with random or missing credentials and followed by
    events and agent reports: no rank bound, no node view, no events file."""
    with _hub(tmp_path) as hub:
        @FUZZ
        @given(kind=st.sampled_from(["rank", "node"]), fields=st.dictionaries(
                   st.sampled_from(["gen", "rank", "node", "t", "pid", "host"]), _value),
               answer=st.none() | st.text(max_size=80) | st.just("0" * 64),
               cut=st.none() | st.integers(0, 200))
        def one(kind: str, fields: dict, answer: str | None, cut: int | None) -> None:
            hello = json.dumps({"hello": kind, "protocol": HUB_PROTOCOL, **fields}).encode()
            rest = (b"" if answer is None else json.dumps({"mac": answer}).encode()) + b"\n"
            rest += _event(0, 0) + json.dumps({"ranks": {"0": {"pid": 1, "code": 0}}}).encode()
            payload = hello + b"\n" + rest + b"\n"
            _send_and_close(hub, payload if cut is None else payload[:cut])
            assert _forged_lines(hub) == [] and not hub.nodes and not hub.beats
        one()
        _serves(hub)


def test_fuzz_interleaved_hellos_of_trusted_and_forged_peers(tmp_path):
    """Several connections at once, their bytes cut into random pieces and sent in a random
    interleaving: the trusted ranks' events arrive whole and in order, the forged ones nowhere,
    whatever the interleaving."""
    with _hub(tmp_path) as hub:
        seen = {"rank": 0}

        @FUZZ
        @given(forged=st.integers(1, 3), pieces=st.lists(st.integers(1, 40), min_size=1,
                                                         max_size=12), order=st.lists(st.integers(0, 3), max_size=64))
        def one(forged: int, pieces: list[int], order: list[int]) -> None:
            rank = seen["rank"] = seen["rank"] + 1  # a rank of its own per example
            before = _refused(hub)
            peers = [_connect(hub) for _ in range(1 + forged)]
            try:
                # the trusted one answers its challenge first, then its events go out in pieces
                buf = hub_hello(peers[0], _hello(rank), hub.secret, time.monotonic() + WAIT_S)
                hub_line(peers[0], buf, time.monotonic() + WAIT_S, "plan")
                streams = [b"".join(_event(rank, i) for i in range(3))]
                streams += [json.dumps(_hello(rank)).encode() + b"\n{\"mac\": \"" +
                            b"ab" * 32 + b"\"}\n" + _event(rank, 99) for _ in range(forged)]
                cuts = [[] for _ in streams]
                for i, data in enumerate(streams):
                    at = 0
                    for n in pieces * (len(data) // max(1, sum(pieces)) + 1):
                        if at >= len(data):
                            break
                        cuts[i].append(data[at:at + n])
                        at += n
                # the interleaving is fixed before anything is sent (``order`` picks the next
                # peer among those with bytes left): what the hub does changes nothing drawn
                left = [len(cs) for cs in cuts]
                schedule = []
                while any(left):
                    ready = [k for k, n in enumerate(left) if n]
                    i = ready[order[len(schedule) % len(order)] % len(ready)] if order else ready[0]
                    schedule.append(i)
                    left[i] -= 1
                closed: set[int] = set()
                for i in schedule:
                    piece = cuts[i].pop(0)
                    if i in closed:
                        continue
                    try:
                        peers[i].sendall(piece)
                    except OSError:
                        closed.add(i)  # a forged one the hub already closed
            finally:
                for s in peers:
                    s.close()
            _until(lambda: (0, rank) in hub.ended and _refused(hub) == before + forged,
                   f"the trusted end and the forged refusals ({forged} forged, {before} before)",
                   state=lambda: f"ended: {(0, rank) in hub.ended}, counts: {hub.counts()}, "
                                 f"errors: {hub.errors}, pending: {hub.pending()}")
            events, torn, _ = read_jsonl(hub.dir.rank_events(0, rank))
            assert [e["step"] for _, e in events] == [0, 1, 2] and not torn
        one()
        names = {p.name for p in hub.dir.events.iterdir()}
        assert names == {f"g0-r{r}.jsonl" for r in range(1, seen["rank"] + 1)}
        assert set(_reasons(hub)) <= {Refusal.BAD_CREDENTIALS, Refusal.CLOSED}
        hub.check()


def test_fuzz_replayed_answers_from_a_trusted_exchange_all_fail(tmp_path):
    """Capture a trusted rank's exchange (hello line, nonce, answer); replay the answer under
    any hello a forger might pick, with the captured nonce or a random one: all refused."""
    with _hub(tmp_path) as hub:
        line = json.dumps(_hello(1), separators=(",", ":")).encode()
        with _connect(hub) as s:
            s.sendall(line + b"\n")
            buf = bytearray()
            nonce = json.loads(hub_line(s, buf, time.monotonic() + WAIT_S, "nonce"))["nonce"]
            mac = hub_mac(hub.secret, nonce, line)
            s.sendall(json.dumps({"mac": mac}).encode() + b"\n")
            hub_line(s, buf, time.monotonic() + WAIT_S, "plan")

        @FUZZ
        @given(rank=st.integers(0, 3), same_line=st.booleans())
        def one(rank: int, same_line: bool) -> None:
            hello = line if same_line else json.dumps(_hello(rank)).encode()
            _send_and_close(hub, hello + b"\n" + json.dumps({"mac": mac}).encode() + b"\n"
                            + _event(rank, 7))
        one()
        _until(lambda: (0, 1) in hub.ended, "the trusted rank's end")
        assert sorted(p.name for p in hub.dir.events.iterdir()) == ["g0-r1.jsonl"]
        assert not read_jsonl(hub.dir.rank_events(0, 1))[0]
        assert set(_reasons(hub)) == {Refusal.BAD_CREDENTIALS}


# -- orders to node agents (slurm-fork) ------------------------------------------------------
def _node(hub: Hub, node: int, host: str, gen: int = 1) -> tuple[socket.socket, bytearray]:
    s = _connect(hub)
    buf = hub_hello(s, {"hello": "node", "protocol": HUB_PROTOCOL, "gen": gen, "node": node,
                        "host": host}, hub.secret, time.monotonic() + WAIT_S)
    return s, buf


def test_an_order_reaches_its_nodes_agent_whether_it_said_hello_before_or_after(hub):
    """A waiting step's agents connect before their generation launches (ordered on arrival of
    the order), or after (ordered at their hello); an order is for one generation and node."""
    early, early_buf = _node(hub, 0, "n1")
    _until(lambda: (1, 0) in hub.nodes, "the early agent bound")
    hub.order(1, "n1", {"argv": ["x.py"], "ranks": [[0, {"RANK": "0"}]]})
    hub.order(1, "n2", {"argv": ["x.py"], "ranks": []})
    hub.order(2, "n1", {"argv": ["x.py"], "ranks": [[5, {}]]})  # the next generation's: not now
    late, late_buf = _node(hub, 1, "n2")
    with early, late:
        got = json.loads(hub_line(early, early_buf, time.monotonic() + WAIT_S, "an order"))
        assert got == {"order": {"argv": ["x.py"], "ranks": [[0, {"RANK": "0"}]]}}
        got = json.loads(hub_line(late, late_buf, time.monotonic() + WAIT_S, "an order"))
        assert got == {"order": {"argv": ["x.py"], "ranks": []}}
        early.settimeout(0.2)
        with pytest.raises(TimeoutError):  # nothing else came: not generation 2's order
            early.recv(1 << 16)
    _serves(hub)
