"""Unit tests of the LM workload's pure parts: data order, digests, checkpoint and snapshot files.

No processes are started here; the multi-rank behaviour is covered by the harness's own tests.
"""
from __future__ import annotations



from pytest_reshard.fixtures import _common as C


def test_process_start_time_is_in_the_past():
    """This process started before now; a process started now says so (not this suite's own
    start, which may be any number of minutes ago)."""
    import subprocess
    import sys
    import time

    assert 0 <= time.time() - C.process_start_time()
    age = subprocess.run([sys.executable, "-c", "import time; from pytest_reshard.fixtures "
                          "import _common as C; print(time.time() - C.process_start_time())"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert 0 <= float(age) < 60
