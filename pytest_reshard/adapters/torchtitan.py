"""torchtitan's ``Trainer`` under the harness, in one line after building it:

    from pytest_reshard.adapters import torchtitan

    trainer = config.build()
    torchtitan.instrument(trainer)
    trainer.train()

What it records, and where (wrapping the trainer's own objects, on the instance):

- a step per ``Trainer.train_step`` (harness step = torchtitan's ``step - 1``: torchtitan counts
  from 1), its loss (the global mean, as torchtitan logs it: the sum over ranks of each
  rank's ``forward_backward_step`` loss, which is already divided by the global token count);
- the sample ids of each micro-batch as ``Trainer.batch_generator`` hands it over (by default a
  hash of each row's tokens: torchtitan's packed windows carry no index of their own);
- fault points: ``forward`` (entering ``forward_backward_step``), ``backward`` (a forward hook:
  the model's output is there, the loss and the backward are next), ``optimizer`` (entering
  ``optimizers.step``), ``checkpoint`` (entering ``CheckpointManager.save`` when it will save:
  the state is live, nothing written) and ``checkpoint_commit`` (its DCP save returned on this
  rank: files and ``.metadata`` written, the save not yet recorded). Inside the DCP save the
  file watcher's points (``kill_at_file_event``, the sweep) reach every write and rename
  without touching DCP's writer;
- saves (the digests taken as ``CheckpointManager.save`` begins, recorded as ``saving``, and
  as the save once it wrote one) and the load (``CheckpointManager.load``
  returned), each with the digests of what the checkpoint holds: ``model`` (gathered),
  ``optimizer`` (gathered), ``lr_scheduler``, ``train_state`` (step, tokens seen) and
  ``data`` (this rank's data-loader state: per rank). torchtitan saves no RNG, and the
  digests say so by not naming one. A model-only save (``last_save_model_only``, torchtitan's
  default for the final step) records ``model`` alone, so a resume from it is judged by what
  it lacks;
- a planned reshard or a SIGTERM: every rank agrees after the same step (one all-reduce per
  step, shared with the loss); the checkpointer then saves that step (a full save) and
  ``should_continue_training`` stops the loop;
- ``max_rewind_steps``: the checkpoint interval.

Under the harness the checkpointer's folder is moved into the run's work folder
(``<work>/<checkpoint.folder>``, recorded as a ``checkpoint_folder`` note), so the script needs
no change of its ``dump_folder``.

Private API it touches (pinned: torchtitan >=0.3,<0.4; tested with 0.3.0):
``CheckpointManager._should_save`` (asked whether a step saves, answered yes at a planned stop).
"""
from __future__ import annotations

import hashlib
import pickle
from pathlib import Path
from typing import Any, Callable, Sequence

from pytest_reshard import probe
from pytest_reshard.adapters._common import (attach, distributed, reduce_step, require_version,
                                             stop_wanted)

__all__ = ["instrument", "workload", "token_ids", "SUPPORTED", "TESTED", "PRELOAD"]

#: torchtitan versions the adapter supports, ``[low, high)``, and the one its tests run.
SUPPORTED = ("0.3", "0.4")
TESTED = "0.3.0"
#: What the fork server imports for a torchtitan script (``workload``): its import costs
#: seconds (datasets, tensorboard, the model registry).
PRELOAD = ("torchtitan.trainer", "torchtitan.models.llama3.config_registry",
           "torchtitan.hf_datasets.text_datasets", "pytest_reshard.adapters.torchtitan")
#: Components that are each rank's own; the rest are replicated (gathered before digesting).
PER_RANK = ("data",)
_PRIVATE = ("CheckpointManager._should_save",)


def workload(name: str, script: str | Path, *, preload: Sequence[str] = (),
             replace: bool = True, **spec: Any) -> Any:
    """Register ``script`` (a torchtitan Trainer script) as workload ``name``: the fork server
    imports ``preload`` first (``pytest_reshard.adapters.torchtitan_cpu`` on CPU: its patches
    must precede torchtitan's modules), then torchtitan's trainer, so a relaunch does not pay
    for importing them. Returns the ``WorkloadSpec``."""
    from pytest_reshard.workloads import WorkloadSpec, register

    return register(WorkloadSpec(name, script=str(script), preload=(*preload, *PRELOAD), **spec),
                    replace=replace)


def token_ids(input_dict: dict[str, Any], labels: Any) -> list[int]:
    """A global id per row: a hash of its input tokens (a packed window has no index)."""
    rows = input_dict["input"].reshape(input_dict["input"].shape[0], -1).cpu().numpy()
    return [int.from_bytes(hashlib.blake2b(r.tobytes(), digest_size=8).digest(), "big") >> 2
            for r in rows]


def instrument(trainer: Any, sample_ids: Callable[[dict[str, Any], Any], list[int]] | None = token_ids,
               *, max_rewind_steps: int | None = None) -> "Instrumented":
    """Connect ``trainer`` (a built ``torchtitan.trainer.Trainer``) to the harness, before
    ``trainer.train()``. Outside the harness the probe is inactive and nothing is recorded.

    ``sample_ids(input_dict, labels)``: the global ids of a micro-batch's rows (None: the data
    has none, and ``exactly_once_samples`` says it cannot tell). ``max_rewind_steps``: what an
    unplanned failure may cost; by default the checkpoint interval."""
    import torchtitan

    require_version("torchtitan", torchtitan.__version__, SUPPORTED, TESTED, _PRIVATE)
    existing = getattr(trainer, "_reshard_instrumented", None)
    if existing is not None:
        return existing
    ckpt = trainer.checkpointer
    if not getattr(ckpt, "enable", False):
        raise RuntimeError("pytest_reshard.adapters.torchtitan: the trainer's checkpointing is off; "
                           "set checkpoint.enable (the harness judges saves and resumes)")
    missing = [m for m in ("train_step", "forward_backward_step", "batch_generator",
                           "should_continue_training", "model_parts", "optimizers", "dataloader")
               if not hasattr(trainer, m)]
    missing += [f"checkpointer.{m}" for m in ("load", "save", "_should_save", "folder", "interval")
                if not hasattr(ckpt, m)]
    if missing:
        raise RuntimeError(f"pytest_reshard.adapters.torchtitan: this Trainer ({type(trainer).__name__}, "
                           f"torchtitan {torchtitan.__version__}) has no {', '.join(missing)}; the "
                           f"adapter is tested with torchtitan {TESTED}")
    out = Instrumented(trainer, sample_ids, max_rewind_steps)
    trainer._reshard_instrumented = out
    out.redirect()
    out.wrap()
    return out


class Instrumented:
    """The probe calls ``instrument`` adds to one Trainer."""

    def __init__(self, trainer: Any, sample_ids: Callable[[dict[str, Any], Any], list[int]] | None,
                 max_rewind_steps: int | None) -> None:
        self.trainer = trainer
        self.sample_ids = sample_ids
        self.max_rewind_steps = max_rewind_steps
        self.run = attach()
        self.step: probe.Step | None = None
        self.loss_sum = 0.0
        self.stopping = False

    def redirect(self) -> None:
        """Under the harness, save and load under the run's work folder (the same folder in
        every generation, a fresh one per run): the script keeps its own ``dump_folder`` and
        the clean reference runs do not resume from each other's checkpoints."""
        workdir = self.run.workdir if self.run.active else None
        if workdir is None:
            return
        ckpt = self.trainer.checkpointer
        folder = str(Path(workdir) / self.trainer.config.checkpoint.folder)
        if Path(ckpt.folder).resolve() != Path(folder).resolve():
            self.run.note("checkpoint_folder", was=str(ckpt.folder), now=folder)
            ckpt.folder = folder

    # -- wrapping --------------------------------------------------------------------------
    def wrap(self) -> None:
        t, ckpt = self.trainer, self.trainer.checkpointer
        train, train_step, fwd_bwd = t.train, t.train_step, t.forward_backward_step
        batches, should_continue = t.batch_generator, t.should_continue_training
        load, save, should_save = ckpt.load, ckpt.save, ckpt._should_save
        opt_step = t.optimizers.step

        def wrapped_train(*args: Any, **kwargs: Any) -> Any:
            out = train(*args, **kwargs)
            self.run.close()
            return out

        def wrapped_load(*args: Any, **kwargs: Any) -> Any:
            loaded = load(*args, **kwargs)
            self.on_load(loaded)
            return loaded

        def wrapped_batches(data_iterable: Any) -> Any:
            for input_dict, labels in batches(data_iterable):
                if self.step is not None and self.sample_ids is not None:
                    self.step.record(samples=self.sample_ids(input_dict, labels))
                yield input_dict, labels

        def wrapped_train_step(*args: Any, **kwargs: Any) -> Any:
            self.loss_sum = 0.0
            self.step = s = self.run.begin_step(t.step - 1)
            try:
                out = train_step(*args, **kwargs)
            except BaseException as e:
                self.step = None
                self.run.end_step(error=e)
                raise
            self.step = None
            self.on_step_end(s)
            return out

        def wrapped_fwd_bwd(*args: Any, **kwargs: Any) -> Any:
            if self.step is not None:
                self.step.point("forward")
            loss = fwd_bwd(*args, **kwargs)
            self.loss_sum += float(loss.detach().float().sum().item())
            return loss

        def backward_point(module: Any, inputs: Any, output: Any) -> None:
            if self.step is not None and module.training:
                self.step.point("backward")

        def wrapped_opt_step(*args: Any, **kwargs: Any) -> Any:
            if self.step is not None:
                self.step.point("optimizer")
            return opt_step(*args, **kwargs)

        def wrapped_should_save(curr_step: int, last_step: bool = False) -> bool:
            return bool(should_save(curr_step, last_step)) or (self.stopping and not ckpt.load_only)

        def wrapped_save(curr_step: int, last_step: bool = False) -> Any:
            will = ckpt._should_save(curr_step, last_step) and self.run.active
            model_only = bool(last_step and ckpt.last_save_model_only)
            digest = self.digests(model_only) if will else {}   # a collective: before the save
            if will:
                self.run.point("checkpoint", step=curr_step - 1)
                self.run.checkpoint_saving(curr_step - 1, digest, per_rank=PER_RANK)
            done = save(curr_step, last_step)
            if done and will:
                self.run.point("checkpoint_commit", step=curr_step - 1)
                self.on_save(curr_step, digest, model_only=model_only)
            return done

        def wrapped_should_continue() -> bool:
            return bool(should_continue()) and not self.stopping

        t.train, t.train_step, t.forward_backward_step = wrapped_train, wrapped_train_step, wrapped_fwd_bwd
        t.batch_generator, t.should_continue_training = wrapped_batches, wrapped_should_continue
        t.optimizers.step = wrapped_opt_step
        ckpt.load, ckpt.save, ckpt._should_save = wrapped_load, wrapped_save, wrapped_should_save
        t.model_parts[0].register_forward_hook(backward_point)

    # -- digests ---------------------------------------------------------------------------
    def digests(self, model_only: bool = False) -> dict[str, str]:
        """What a checkpoint holds, gathered (a collective: every rank calls it at the same
        point). ``data`` is this rank's own."""
        t = self.trainer
        model = {k: v for m in t.model_parts for k, v in m.state_dict().items()}
        out = {"model": probe.digest(model)}
        if model_only:
            return out
        out["optimizer"] = probe.digest(t.optimizers.state_dict())
        out["lr_scheduler"] = probe.digest(t.lr_schedulers.state_dict())
        out["train_state"] = probe.digest(t.state_dict())
        data = t.dataloader.state_dict()
        out["data"] = probe.digest({k: pickle.loads(v) if isinstance(v, bytes) else v
                                    for k, v in data.items()})
        return out

    def world(self) -> int:
        return distributed()[1]

    # -- events ----------------------------------------------------------------------------
    def on_load(self, loaded: bool) -> None:
        t, ckpt = self.trainer, self.trainer.checkpointer
        budget = self.max_rewind_steps if self.max_rewind_steps is not None else ckpt.interval
        step = t.step  # torchtitan's count of steps done: the harness's next step
        self.run.resumed(step, source="checkpoint" if loaded and step else "fresh",
                         max_rewind_steps=budget)
        if loaded and step and self.run.active:
            self.run.checkpoint_loaded(step - 1, self.digests(), per_rank=PER_RANK,
                                       world_size=self.world(), digest_at="restore",
                                       path=str(Path(ckpt.folder) / f"step-{step}"))

    def on_step_end(self, s: probe.Step) -> None:
        loss, stop = reduce_step(self.loss_sum, stop_wanted(self.run), self.trainer.device)
        s.record(loss=loss * self.world())  # each rank's loss is its share of the global mean
        self.run.end_step()
        if stop and not self.stopping:
            self.stopping = True
            self.run.note("planned_stop", step=s.step,
                          reason="reshard" if self.run.reshard_requested() else "sigterm")

    def on_save(self, curr_step: int, digest: dict[str, str], *, model_only: bool) -> None:
        path = Path(self.trainer.checkpointer.folder) / f"step-{curr_step}"
        self.run.checkpoint_saved(curr_step - 1, digest, per_rank=PER_RANK,
                                  path=str(path), world_size=self.world(), model_only=model_only)
