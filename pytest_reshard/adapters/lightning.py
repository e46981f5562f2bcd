"""Lightning under the harness, in one line: add the callback.

    from pytest_reshard.adapters import lightning as reshard

    trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=world, max_steps=steps,
                        callbacks=[reshard.ReshardCallback(sample_ids="sample_id"),
                                   ModelCheckpoint(dirpath=reshard.output_dir("ckpt"),
                                                   save_last=True, ...)])
    trainer.fit(model, loader, ckpt_path="last")

``output_dir("ckpt")`` is ``"ckpt"`` outside the harness and the run's work folder under it (it
outlives a generation; the clean reference run, started with the same command line, has its
own). The callback cannot move the folder itself: ``Trainer.fit`` resolves ``ckpt_path="last"``
(``_CheckpointConnector._select_ckpt_path``) before it calls any callback hook, so a folder
moved at ``setup`` would take the saves but not the resume. Under the harness it refuses, at
``setup``, a ``ModelCheckpoint`` that saves outside the work folder, saying this.

What it records, and where (public ``Callback`` hooks; two public methods wrapped on the
instance at ``setup``):

- a step per batch (``on_train_batch_start`` -> ``run.begin_step(trainer.global_step)``;
  ``on_train_batch_end`` -> the loss, the mean over ranks of what ``on_before_backward`` saw,
  and ``run.end_step()``); one optimizer step per batch (``accumulate_grad_batches=1``);
- the sample ids of the batch (``sample_ids``: the key of a dict batch, the index of a tuple
  batch, or a function of the batch), with ``trainer.current_epoch`` as their epoch;
- fault points ``forward`` (end of ``on_train_batch_start``), ``backward``
  (``on_before_backward``), ``optimizer`` (``on_before_optimizer_step``), ``checkpoint``
  (entering ``Trainer.save_checkpoint``, before the state is gathered) and
  ``checkpoint_commit`` (entering ``Strategy.save_checkpoint``: the state is gathered, rank 0
  has not written the file yet);
- saves: the digests are taken of the checkpoint dict itself (``on_save_checkpoint``, where
  each rank records that it is ``saving``), and the save is recorded only when
  ``Trainer.save_checkpoint`` has returned on this rank (after its barrier: rank 0 has written
  the file) and the file exists;
- loads: at ``on_train_start`` after the restore (model, optimizers, LR schedulers and loops
  restored), with a digest per rank of ``model``, ``optimizer``, ``lr_scheduler``, ``data``
  (epoch and samples into it, where the data stream really resumes: a loader without
  ``state_dict``/``load_state_dict`` restarts its epoch), ``loop`` (global step and epoch) and
  ``rng`` (this rank's Python, NumPy and torch generators: a ``.ckpt`` does not hold them, a
  user's callback may). The ``rng`` digest is taken earlier, at ``on_fit_start``: after every
  callback's ``on_load_checkpoint`` (where a callback restores what it saved), before Lightning
  builds the data iterator, whose ``iter()`` draws its base seed from torch's generator before
  ``on_train_start``;
- a planned reshard or a SIGTERM: every rank agrees after the same batch, the callback writes
  ``last-stop.ckpt`` into the ``ModelCheckpoint``'s folder and sets ``trainer.should_stop``;
  ``ckpt_path="last"`` resumes from the newest ``last*.ckpt``, and a ``ModelCheckpoint(
  save_last=True)`` writes ``last.ckpt`` after a stop mid-epoch (at ``on_train_epoch_end`` or
  ``on_train_end``, counting the interrupted epoch as done), so at ``teardown`` rank 0 makes
  ``last-stop.ckpt`` the newest again (its mtime) and logs that it did. (A SIGTERM stop never
  gets there: Lightning's own SIGTERM handling raises at the next batch.)
- ``state_each_step=True``: after each batch (the optimizer and LR scheduler stepped), the
  live ``model``, ``optimizer``, ``lr_scheduler`` and ``loop`` as a save would hold them
  (``run.state_after``), so ``one_step_checkpoint`` can name the step each component of a
  loaded checkpoint holds (an asynchronous ``CheckpointIO`` that writes live tensors); a
  digest of the whole state each step, so off by default;
- ``max_rewind_steps``: the ``ModelCheckpoint``'s ``every_n_train_steps`` (or the batches of an
  epoch for ``every_n_epochs=1``).

Supported: lightning (``lightning.pytorch``, or ``pytorch_lightning``) >=2.4,<3; tested with 2.6.6.
No private Lightning API is touched.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from pytest_reshard import probe
from pytest_reshard.adapters._common import (attach, reduce_step, require_version, rng_digest,
                                             stop_wanted)

# F822: ReshardCallback is built on first access (__getattr__), so importing this needs no lightning
__all__ = ["ReshardCallback", "workload", "output_dir", "SUPPORTED", "TESTED",  # noqa: F822
           "PRELOAD"]

SUPPORTED = ("2.4", "3.0")
TESTED = "2.6.6"
PRELOAD = ("lightning.pytorch", "pytest_reshard.adapters.lightning")
PER_RANK = ("rng",)
_CLASSES: dict[str, type] = {}


def workload(name: str, script: str | Path, *, preload: Sequence[str] = (),
             replace: bool = True, **spec: Any) -> Any:
    """Register ``script`` (a Lightning script) as workload ``name`` with Lightning preloaded by
    the fork server. Returns the ``WorkloadSpec``."""
    from pytest_reshard.workloads import WorkloadSpec, register

    return register(WorkloadSpec(name, script=str(script), preload=(*PRELOAD, *preload), **spec),
                    replace=replace)


def output_dir(default: str | os.PathLike) -> str:
    """The folder to give ``ModelCheckpoint(dirpath=...)``: the run's work folder under the
    harness (every generation's, and this run's alone), ``default`` outside it."""
    work = probe.attach().workdir
    return str(work if work is not None else default)


def __getattr__(name: str) -> Any:
    # ReshardCallback subclasses Lightning's Callback: built on first use, so that importing
    # this module does not import Lightning.
    if name == "ReshardCallback":
        return callback_class()
    raise AttributeError(name)


def callback_class(package: str | None = None) -> type:
    """The callback class for ``package`` (``"lightning.pytorch"`` or ``"pytorch_lightning"``;
    by default the first importable)."""
    import importlib

    if package is None:
        try:
            importlib.import_module("lightning.pytorch")
            package = "lightning.pytorch"
        except ImportError:
            package = "pytorch_lightning"
    if package not in _CLASSES:
        pl = importlib.import_module(package)
        require_version(package.split(".")[0], pl.__version__, SUPPORTED, TESTED)
        _CLASSES[package] = _make(pl)
    return _CLASSES[package]


def _ids_of(batch: Any, key: Any) -> list[int] | None:
    if key is None:
        return None
    ids = key(batch) if callable(key) else batch[key]
    return [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]


def newest_last(path: str, prefix: str = "last") -> None:
    """Make ``path`` the newest of its folder's checkpoints that ``ckpt_path="last"`` considers
    (a name starting with ``prefix``, ModelCheckpoint's ``CHECKPOINT_NAME_LAST``; Lightning
    takes the one with the latest mtime), and say so when a later one had to be outdated."""
    folder, name = os.path.split(path)
    if not os.path.exists(path):
        return
    ext = os.path.splitext(name)[1]
    mine = os.stat(path).st_mtime_ns
    later = {f: os.stat(os.path.join(folder, f)).st_mtime_ns for f in os.listdir(folder or ".")
             if f != name and f.startswith(prefix) and f.endswith(ext)}
    later = {f: t for f, t in later.items() if t >= mine}
    if not later:
        return
    # a millisecond past the newest: Lightning compares mtimes as datetimes (microseconds)
    t = max(time.time_ns(), max(later.values()) + 1_000_000)
    os.utime(path, ns=(t, t))
    print(f"pytest_reshard.adapters.lightning: the planned stop saved {name} mid-epoch; "
          f"{', '.join(sorted(later))} was written after it with the interrupted epoch counted "
          f'as done, so {name} is now the newest: ckpt_path="last" resumes from it',
          file=sys.stderr, flush=True)


def _make(pl: Any) -> type:
    from importlib import import_module

    ModelCheckpoint = import_module(pl.__name__ + ".callbacks").ModelCheckpoint

    class ReshardCallback(pl.Callback):
        """Records steps, samples, loss, saves and loads for the harness, marks its fault points,
        and turns a planned reshard or a SIGTERM into a save of ``last-stop.ckpt`` and a stop."""

        def __init__(self, sample_ids: str | int | Callable[[Any], Any] | None = "sample_id", *,
                     max_rewind_steps: int | None = None, last_name: str = "last-stop",
                     state_each_step: bool = False) -> None:
            self.sample_ids = sample_ids
            self.state_each_step = state_each_step
            self.max_rewind_steps = max_rewind_steps
            self.last_name = last_name
            self.run = attach()
            self.step: probe.Step | None = None
            self.loss_sum = 0.0
            self.loaded_step: int | None = None
            self.pending_save: dict[str, str] | None = None
            self.restored_rng = ""      # the RNG's digest at on_fit_start, after the restore
            self.batches = 0            # batches of the current epoch done
            self.stopping = False
            self.stop_path: str | None = None   # the planned stop's save
            self.wrapped = False

        # -- wrapping (public methods, on the instance) ------------------------------------
        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            if stage != "fit" or self.wrapped:
                return
            if trainer.accumulate_grad_batches != 1:
                raise NotImplementedError("pytest_reshard.adapters.lightning records one step "
                                          "per batch: use accumulate_grad_batches=1")
            self.wrapped = True
            self.check_folders(trainer)
            save, strategy_save = trainer.save_checkpoint, trainer.strategy.save_checkpoint

            def save_checkpoint(filepath: Any, *args: Any, **kwargs: Any) -> Any:
                step = trainer.global_step - 1
                self.run.point("checkpoint", step=step)
                out = save(filepath, *args, **kwargs)
                digest, self.pending_save = self.pending_save, None
                if digest is not None and os.path.exists(filepath):
                    self.run.checkpoint_saved(step, digest, per_rank=PER_RANK, path=str(filepath),
                                              world_size=trainer.world_size)
                return out

            def strategy_save_checkpoint(*args: Any, **kwargs: Any) -> Any:
                self.run.point("checkpoint_commit", step=trainer.global_step - 1)
                return strategy_save(*args, **kwargs)

            trainer.save_checkpoint = save_checkpoint
            trainer.strategy.save_checkpoint = strategy_save_checkpoint

        def check_folders(self, trainer: Any) -> None:
            """Under the harness every ModelCheckpoint must save into the run's work folder: any
            other is shared with the clean reference run (the same command line) and earlier
            runs, whose last.ckpt a resume would then take."""
            work = self.run.workdir
            if work is None:
                return
            root = Path(work).resolve()
            for c in trainer.checkpoint_callbacks:
                if not isinstance(c, ModelCheckpoint):
                    continue
                d = Path(c.dirpath).resolve() if c.dirpath else None
                if d is None or not (d == root or root in d.parents):
                    where = str(c.dirpath) if c.dirpath else "the Trainer's default_root_dir"
                    raise RuntimeError(
                        f"pytest_reshard.adapters.lightning: ModelCheckpoint saves to {where}, "
                        f"outside this run's work folder {work}: the clean reference run (started "
                        f"with the same command line) and earlier runs save there too, and "
                        f"ckpt_path='last' would resume from their files. Lightning resolves "
                        f"ckpt_path='last' in Trainer.fit before any callback runs, so the "
                        f"callback cannot move it: pass ModelCheckpoint(dirpath=reshard."
                        f"output_dir({str(c.dirpath or 'checkpoints')!r}), ...) (that folder "
                        f"outside the harness, the work folder under it)")

        # -- digests -----------------------------------------------------------------------
        def global_batch(self, trainer: Any, batch: Any = None) -> int:
            n = len(_ids_of(batch, self.sample_ids) or ()) if batch is not None else 0
            if not n:
                loader = trainer.train_dataloader
                n = getattr(loader, "batch_size", None) or 1
            return n * trainer.world_size

        def data_position(self, epoch: int, batches: int, trainer: Any) -> dict[str, int]:
            per_epoch = trainer.num_training_batches
            if isinstance(per_epoch, int) and batches >= per_epoch:
                epoch, batches = epoch + 1, 0
            return {"epoch": int(epoch), "batches": int(batches)}

        def digests(self, model_sd: Any, optim: Any, sched: Any, loop: Any, data: Any,
                    rng: str) -> dict[str, str]:
            return {**self.trained(model_sd, optim, sched, loop), "data": probe.digest(data),
                    "rng": rng}

        def trained(self, model_sd: Any, optim: Any, sched: Any, loop: Any) -> dict[str, str]:
            """The digests of what training updates: those ``state_each_step`` records."""
            return {"model": probe.digest(model_sd), "optimizer": probe.digest(optim),
                    "lr_scheduler": probe.digest(sched), "loop": probe.digest(loop)}

        def live(self, trainer: Any, pl_module: Any) -> tuple[Any, Any, Any]:
            """The model's, optimizers' and LR schedulers' state as ``on_save_checkpoint``'s
            dict holds them."""
            return (pl_module.state_dict(), [o.state_dict() for o in trainer.optimizers],
                    [c.scheduler.state_dict() for c in trainer.lr_scheduler_configs])

        def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict) -> None:
            # The dict is what the file will hold; the RNG is this rank's, which it does not hold.
            self.pending_save = self.digests(
                checkpoint.get("state_dict"), checkpoint.get("optimizer_states"),
                checkpoint.get("lr_schedulers"),
                {"global_step": checkpoint.get("global_step"), "epoch": checkpoint.get("epoch")},
                self.data_position(trainer.current_epoch, self.batches, trainer), rng_digest())
            self.run.checkpoint_saving(trainer.global_step - 1, self.pending_save,
                                       per_rank=PER_RANK)

        def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict) -> None:
            self.loaded_step = int(checkpoint.get("global_step", 0)) - 1
            self.loaded_epoch = checkpoint.get("epoch")

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            # Every callback's on_load_checkpoint has run (unless the strategy restores after
            # its setup: then the load is not known yet); the data iterator, whose iter() draws
            # from torch's generator, is built after this and before on_train_start.
            if self.loaded_step is not None:
                self.restored_rng = rng_digest()

        # -- the loop ----------------------------------------------------------------------
        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            # Everything is restored by now (model, optimizers, schedulers, loops): the digests
            # of the restore, with the RNG as on_fit_start found it.
            gs = trainer.global_step
            self.run.resumed(gs, source="checkpoint" if self.loaded_step is not None else "fresh",
                             max_rewind_steps=self.budget(trainer))
            if self.loaded_step is None:
                return
            loaders = trainer.train_dataloader
            loaders = loaders if isinstance(loaders, (list, tuple)) else [loaders]
            stateful = all(callable(getattr(dl, "state_dict", None)) and
                           callable(getattr(dl, "load_state_dict", None)) for dl in loaders)
            # Where the data really resumes: a loader without state restarts its epoch.
            n = trainer.num_training_batches
            done = gs % n if isinstance(n, int) and n and stateful else 0
            self.batches = done
            epoch = gs // n if isinstance(n, int) and n else trainer.current_epoch
            # the RNG's digest vouches for the restore only if on_fit_start took it: by now the
            # data iterator has drawn from it
            at: dict[str, Any] = {"digest_at": "restore, before the data iterator"} \
                if self.restored_rng else {}
            self.run.checkpoint_loaded(
                self.loaded_step, self.digests(
                    *self.live(trainer, pl_module), {"global_step": gs, "epoch": self.loaded_epoch},
                    self.data_position(epoch, done, trainer), self.restored_rng or rng_digest()),
                per_rank=PER_RANK, path=str(trainer.ckpt_path), world_size=trainer.world_size,
                resumable_data=stateful, **at)

        def budget(self, trainer: Any) -> int | None:
            if self.max_rewind_steps is not None:
                return self.max_rewind_steps
            steps = [c._every_n_train_steps for c in trainer.checkpoint_callbacks
                     if isinstance(c, ModelCheckpoint) and getattr(c, "_every_n_train_steps", None)]
            if steps:
                return min(steps)
            n = trainer.num_training_batches
            return int(n) if isinstance(n, int) else trainer.max_steps

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            self.batches = 0

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                                 batch_idx: int) -> None:
            self.loss_sum = 0.0
            s = self.step = self.run.begin_step(trainer.global_step)
            ids = _ids_of(batch, self.sample_ids)
            if ids is not None:
                s.record(samples=ids, epoch=trainer.current_epoch)
            s.point("forward")

        def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
            self.loss_sum += float(loss.detach().float().item())
            if self.step is not None:
                self.step.point("backward")

        def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
            if self.step is not None:
                self.step.point("optimizer")

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                               batch_idx: int) -> None:
            s, self.step = self.step, None
            loss, stop = reduce_step(self.loss_sum, stop_wanted(self.run), pl_module.device)
            self.batches += 1
            if s is not None:
                s.record(loss=loss)
                self.run.end_step()
            if self.state_each_step:
                self.run.state_after(trainer.global_step - 1, self.trained(
                    *self.live(trainer, pl_module),
                    {"global_step": trainer.global_step, "epoch": trainer.current_epoch}))
            if stop and not self.stopping:
                self.stopping = True
                self.run.note("planned_stop", step=trainer.global_step - 1,
                              reason="reshard" if self.run.reshard_requested() else "sigterm")
                path = self.last_path(trainer)
                trainer.save_checkpoint(path)
                n = trainer.num_training_batches
                # at an epoch's last batch the epoch is done: Lightning's own last.ckpt is right
                if not (isinstance(n, int) and self.batches >= n):
                    self.stop_path = path
                trainer.should_stop = True

        def last_path(self, trainer: Any) -> str:
            """Where ``ckpt_path="last"`` looks: the ModelCheckpoint's folder."""
            for c in trainer.checkpoint_callbacks:
                if isinstance(c, ModelCheckpoint) and c.dirpath:
                    return os.path.join(c.dirpath, self.last_name + c.FILE_EXTENSION)
            raise RuntimeError("a planned stop must write a checkpoint that ckpt_path='last' "
                               "finds: add ModelCheckpoint(dirpath=..., save_last=True)")

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            self.run.close()

        def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
            # After every callback's on_train_end: a ModelCheckpoint(save_last=True) may have
            # written last.ckpt after the planned stop (at on_train_epoch_end or on_train_end,
            # with the interrupted epoch counted as done), and ckpt_path="last" takes the newest
            # last*.ckpt: the stop's save must be that one.
            if stage == "fit" and self.stop_path and trainer.is_global_zero:
                newest_last(self.stop_path, ModelCheckpoint.CHECKPOINT_NAME_LAST)

    return ReshardCallback
