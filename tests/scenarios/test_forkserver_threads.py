"""The fork server forks only a single-threaded process: what a real environment's imports start
(pyarrow's jemalloc thread, through ``import datasets``) is kept from starting, and what cannot be
is refused by name, with the way out."""
import pytest

from pytest_reshard.supervisor.launch.forkserver import ForkServer, server_environment

WARMUP = "pytest_reshard.supervisor.launch.warmup"


def test_the_server_preloads_datasets_and_transformers_trainer():
    pytest.importorskip("datasets")
    pytest.importorskip("transformers")
    server = ForkServer(preload=(WARMUP, "datasets", "transformers.trainer"))
    try:
        assert server.alive()
    finally:
        server.close()


def test_a_jemalloc_setting_of_the_user_is_kept_and_its_thread_refused_by_name(monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.setenv("JE_ARROW_MALLOC_CONF", "background_thread:true")
    assert server_environment({"JE_ARROW_MALLOC_CONF": "background_thread:true"})[
        "JE_ARROW_MALLOC_CONF"] == "background_thread:true"
    with pytest.raises(RuntimeError) as refused:
        ForkServer(preload=("datasets",))
    message = str(refused.value)
    assert "jemalloc_bg_thd" in message and "JE_ARROW_MALLOC_CONF=background_thread:false" in message
    assert "--reshard-launcher=local" in message


def test_a_preload_that_starts_a_thread_is_refused_with_the_way_out(tmp_path, monkeypatch):
    (tmp_path / "starts_a_thread.py").write_text(
        "import threading\nthreading.Thread(target=threading.Event().wait, daemon=True).start()\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with pytest.raises(RuntimeError, match=r"started 1 thread\(s\).*--reshard-launcher=local"):
        ForkServer(preload=("starts_a_thread",))
