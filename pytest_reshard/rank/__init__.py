"""The rank side: what runs inside a training process (the probe, the file watcher, telemetry).

It imports only the standard library, ``pytest_reshard.contract``, ``pytest_reshard.procfs`` and
itself (``tests/unit/test_layers.py`` checks), so a training script that imports the probe pulls in
nothing of the harness, torch or pytest. The one exception is lazy: telemetry imports ``pynvml``
inside the function that opens NVML. Nothing here imports torch: ``digest`` and telemetry use
the torch a workload already imported (the tensors handed to them, ``sys.modules``).

Fault executors (``pytest_reshard.chaos``) act on a rank only through ``probe.Run``'s executor
interface: ``emit``, ``hold``, ``notify_reshard``, ``repeat_fault`` and ``watch_files``.
"""
