"""What the harness listens on: the stores it hosts bind one address, never every interface."""
from __future__ import annotations

import gc
import time
from pathlib import Path


def _until(done, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f} s"
        time.sleep(0.005)


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


def test_the_stores_we_host_listen_on_one_address_only():
    """Torch's store listens on every interface unless handed a bound socket; ours are, and a
    store's port is free again once it is gone."""
    from pytest_reshard.supervisor.launch import host_store

    loopback = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it
    store = host_store("127.0.0.1")
    port = store.port
    assert _listening(port) == [loopback]
    store.set("k", "v")
    del store
    gc.collect()
    _until(lambda: not _listening(port), "the store's port closed")
