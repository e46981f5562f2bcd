"""Framework adapters: the probe calls a framework's own hooks make, in one line each.

    from pytest_reshard.adapters import hf          # Hugging Face Trainer
    hf.instrument(trainer, sample_ids="sample_id")

    from pytest_reshard.adapters import lightning   # Lightning
    pl.Trainer(..., callbacks=[lightning.ReshardCallback(sample_ids="sample_id")])

    from pytest_reshard.adapters import accelerate  # a loop of your own on Accelerate
    run = accelerate.instrument(accelerator, sample_ids="sample_id")

    from pytest_reshard.adapters import torchtitan  # torchtitan's Trainer
    torchtitan.instrument(trainer)                  # sample ids: a hash of each packed row

(``torchtitan_cpu`` is not an adapter: importing it patches torchtitan 0.3.0 to run on CPU.)

Each adapter records the steps (``run.begin_step``/``run.end_step``), the loss as the mean over
ranks, the sample ids, the saves and loads with a digest per rank and per component taken at
the restore, marks the fault points ``forward``, ``backward``, ``optimizer``, ``checkpoint`` and
``checkpoint_commit``, and turns a planned reshard or a SIGTERM into a save and a stop agreed by
every rank. Each module imports its framework itself, lazily, when it is used: importing
``pytest_reshard.adapters.hf`` does not import transformers, and nothing else in the package
imports a framework. Each also has ``workload(name, script)``: the ``WorkloadSpec`` that makes
the fork server preload the framework for that script.
"""
