"""Hugging Face ``Trainer`` under the harness, in one line after building the Trainer:

    from pytest_reshard.adapters import hf

    trainer = Trainer(model=model, args=args, train_dataset=ds)
    hf.instrument(trainer, sample_ids="sample_id")   # the dataset's column of global sample ids
    trainer.train(resume_from_checkpoint=get_last_checkpoint(out) if os.path.isdir(out) else None)

What it records, and where (public ``TrainerCallback`` hooks unless said otherwise):

- a step per optimizer update: ``on_step_begin`` -> ``run.begin_step(global_step)``, ``on_step_end``
  -> the loss (the mean over ranks of what ``training_step`` returned, summed over the
  accumulation: the value the Trainer logs) and ``run.end_step()``;
- the sample ids of each micro-batch, taken out of the batch before the model sees it (in
  ``compute_loss``, wrapped on the instance; the column is kept through the Trainer's
  ``remove_unused_columns``);
- fault points: ``forward`` (before ``compute_loss``), ``backward`` (after it, right before the
  backward), ``optimizer`` (``on_pre_optimizer_step``), ``checkpoint`` (entering ``save_model``
  inside a checkpoint save, after the save's one collective, so a rank killed there leaves the
  others writing) and ``checkpoint_commit`` (after this rank's RNG file, before rank 0 writes
  ``trainer_state.json``, the file a resume needs);
- saves (``on_save``, once the files are written; each rank's ``saving`` record with its RNG's
  digest just before it writes its RNG file, so a rank killed after that file is still judged)
  and loads (at the restore: after the Trainer
  restored model, optimizer, scheduler and state and, in ``_load_rng_state``, the RNG), with a
  digest per rank of ``model``, ``optimizer``, ``lr_scheduler``, ``rng`` (this rank's Python,
  NumPy and torch generators), ``data`` (epoch and samples into it: where the data stream
  resumes) and ``trainer_state``;
- a planned reshard or a SIGTERM: every rank agrees after the same step (one all-reduce per
  step, shared with the loss), and the Trainer saves and stops there;
- ``max_rewind_steps`` from ``save_steps`` (``save_strategy="epoch"``: the steps of an epoch);
- under the harness, ``args.output_dir`` becomes the run's work folder (a log line says so): it
  outlives a generation and is this run's alone, while the clean reference run, started with the
  same command line, has its own. Resolve the checkpoint to resume from after ``instrument``
  (``get_last_checkpoint(trainer.args.output_dir)``); a Trainer that starts at step 0 while the
  work folder holds a checkpoint says which.

Private Trainer API it touches (pinned: transformers >=5.0,<6; tested with 5.24.0):
``Trainer._save_rng_state`` and ``Trainer._load_rng_state`` (wrapped: the only places the RNG is
saved and restored), and ``Trainer._signature_columns`` (the sample-id column is added so the
Trainer keeps it in the batch).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Sequence

from pytest_reshard import probe
from pytest_reshard.adapters._common import (attach, reduce_step, require_version, rng_digest,
                                             stop_wanted)

__all__ = ["instrument", "workload", "SUPPORTED", "TESTED", "PRELOAD"]

#: transformers versions the adapter supports, ``[low, high)``, and the one its tests run.
SUPPORTED = ("5.0", "6.0")
TESTED = "5.24.0"
#: What the fork server imports for a Trainer script (``workload``).
PRELOAD = ("transformers", "transformers.trainer", "pytest_reshard.adapters.hf")
#: Components that are each rank's own (``rng_state_{rank}.pth``); the rest are replicated.
PER_RANK = ("rng",)
_PRIVATE = ("Trainer._save_rng_state", "Trainer._load_rng_state", "Trainer._signature_columns")


def workload(name: str, script: str | Path, *, preload: Sequence[str] = (),
             replace: bool = True, **spec: Any) -> Any:
    """Register ``script`` (a Trainer script) as workload ``name``: the fork server preloads
    transformers and its Trainer (plus ``preload``, e.g. your model's module), so a relaunch
    does not pay for importing them. Returns the ``WorkloadSpec``."""
    from pytest_reshard.workloads import WorkloadSpec, register

    return register(WorkloadSpec(name, script=str(script), preload=(*PRELOAD, *preload), **spec),
                    replace=replace)


def instrument(trainer: Any, sample_ids: str | None = "sample_id", *,
               max_rewind_steps: int | None = None) -> Any:
    """Connect ``trainer`` to the harness; returns the callback it added. Outside the harness
    the probe is inactive and only the sample-id column is taken out of each batch.

    ``sample_ids``: the batch key holding each sample's global id (an int per sample; None if
    the data has none: then ``exactly_once_samples`` says it cannot tell).
    ``max_rewind_steps``: what an unplanned failure may cost; by default the save interval."""
    import transformers

    require_version("transformers", transformers.__version__, SUPPORTED, TESTED, _PRIVATE)
    missing = [m for m in ("_save_rng_state", "_load_rng_state", "_set_signature_columns_if_needed",
                           "compute_loss", "training_step", "save_model") if not hasattr(trainer, m)]
    if missing:
        raise RuntimeError(f"pytest_reshard.adapters.hf: this Trainer ({type(trainer).__name__}, "
                           f"transformers {transformers.__version__}) has no {', '.join(missing)}; "
                           f"the adapter is tested with transformers {TESTED}")
    existing = getattr(trainer, "_reshard_callback", None)
    if existing is not None:
        return existing
    cb = _make_callback(transformers)(trainer, sample_ids, max_rewind_steps)
    trainer._reshard_callback = cb
    trainer.add_callback(cb)
    cb.wrap()
    cb.redirect()
    return cb


def _make_callback(transformers: Any) -> type:
    class ReshardCallback(transformers.TrainerCallback):
        """The probe calls of ``instrument``; one per Trainer."""

        def __init__(self, trainer: Any, sample_ids: str | None, max_rewind_steps: int | None) -> None:
            self.trainer = trainer
            self.sample_ids = sample_ids
            self.max_rewind_steps = max_rewind_steps
            self.run = attach()
            self.step: probe.Step | None = None
            self.loss_sum = 0.0
            self.pending_load: dict[str, str] | None = None  # digests taken at the restore
            self.loaded_step = -1
            self.saved_rng: str | None = None
            self.epoch = 0
            self.offset = 0            # samples of this epoch's order consumed so far
            self.first_epoch = True
            self.stopping = False
            self.nupe: int | None = None
            self.redirected = False
            self.told_no_ids = False

        # -- the output folder -------------------------------------------------------------
        def redirect(self) -> None:
            """Under the harness, save into the run's work folder: the script's own output_dir
            would be shared with the clean reference run (the same command line) and with
            every earlier run."""
            work, args = self.run.workdir, self.trainer.args
            self.redirected = False
            if work is None or (args.output_dir and
                                Path(args.output_dir).resolve() == Path(work).resolve()):
                return
            old, args.output_dir = args.output_dir, str(work)
            self.redirected = True
            if args.process_index == 0:
                print(f"pytest_reshard.adapters.hf: under the harness the Trainer's output_dir is "
                      f"the run's work folder {work} (was {old})", file=sys.stderr, flush=True)

        def advise_no_ids(self) -> None:
            """The batches carry no sample-id column: say how to add one (or that there is
            none), in the log and in the sample check's verdict."""
            text = (f"the Trainer's batches have no {self.sample_ids!r} column: add one to the "
                    f"training dataset (dataset.add_column({self.sample_ids!r}, "
                    "list(range(len(dataset))))), or pass hf.instrument(trainer, sample_ids=None) "
                    "when it has none")
            self.run.advise("exactly_once_samples", text)
            if self.trainer.args.process_index == 0:
                print(f"pytest_reshard.adapters.hf: {text}", file=sys.stderr, flush=True)

        def warn_fresh_start(self) -> None:
            """A fresh start while the work folder holds a checkpoint: the script never asked to
            resume, or resolved its resume before instrument moved output_dir."""
            from transformers.trainer_utils import get_last_checkpoint

            work = self.run.workdir
            last = get_last_checkpoint(str(work)) if work is not None and Path(work).is_dir() else None
            if not last:
                return
            text = (f"training started at step 0 although the work folder held {Path(last).name}: "
                    "pass trainer.train(resume_from_checkpoint=get_last_checkpoint("
                    "trainer.args.output_dir))" + (f", resolved after hf.instrument (which set "
                                                   f"output_dir to {work})" if self.redirected
                                                   else ""))
            self.run.advise("no_rewind", text)
            if self.trainer.args.process_index == 0:
                print(f"pytest_reshard.adapters.hf: {text}", file=sys.stderr, flush=True)

        # -- wrapping ----------------------------------------------------------------------
        def wrap(self) -> None:
            t = self.trainer
            if self.sample_ids and t.args.remove_unused_columns:
                t._set_signature_columns_if_needed()
                if self.sample_ids not in t._signature_columns:
                    t._signature_columns.append(self.sample_ids)
            compute_loss, training_step = t.compute_loss, t.training_step
            save_model, save_rng, load_rng = t.save_model, t._save_rng_state, t._load_rng_state

            def wrapped_compute_loss(model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
                ids = inputs.pop(self.sample_ids, None) if self.sample_ids else None
                s = self.step if model.training else None
                if s is None:
                    return compute_loss(model, inputs, *args, **kwargs)
                if ids is None and self.sample_ids and not self.told_no_ids:
                    self.told_no_ids = True
                    self.advise_no_ids()
                if ids is not None:
                    s.record(samples=[int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)],
                             epoch=self.epoch)
                s.point("forward")
                out = compute_loss(model, inputs, *args, **kwargs)
                s.point("backward")
                return out

            def wrapped_training_step(*args: Any, **kwargs: Any) -> Any:
                loss = training_step(*args, **kwargs)
                if self.step is not None:
                    self.loss_sum += float(loss.detach().float().sum().item())
                return loss

            def wrapped_save_model(*args: Any, **kwargs: Any) -> Any:
                if kwargs.get("_internal_call") and self.run.active:
                    self.run.point("checkpoint", step=t.state.global_step - 1)
                return save_model(*args, **kwargs)

            def wrapped_save_rng(output_dir: Any, *args: Any, **kwargs: Any) -> Any:
                rng = rng_digest()   # exactly what the file will hold
                step = t.state.global_step - 1
                self.run.checkpoint_saving(step, {"rng": rng}, per_rank=PER_RANK)
                out = save_rng(output_dir, *args, **kwargs)
                # the save holds this rank's RNG only if the Trainer wrote its file
                name = "rng_state.pth" if t.args.world_size <= 1 else \
                    f"rng_state_{t.args.process_index}.pth"
                self.saved_rng = rng if (Path(output_dir) / name).exists() else None
                if self.run.active:
                    self.run.point("checkpoint_commit", step=step)
                return out

            def wrapped_load_rng(*args: Any, **kwargs: Any) -> Any:
                out = load_rng(*args, **kwargs)
                if self.pending_load is not None:
                    self.pending_load["rng"] = rng_digest()
                    self.emit_load()
                return out

            t.compute_loss, t.training_step, t.save_model = (
                wrapped_compute_loss, wrapped_training_step, wrapped_save_model)
            t._save_rng_state, t._load_rng_state = wrapped_save_rng, wrapped_load_rng

        # -- digests -----------------------------------------------------------------------
        def global_batch(self) -> int:
            a = self.trainer.args
            return a.per_device_train_batch_size * a.gradient_accumulation_steps * max(a.world_size, 1)

        def steps_per_epoch(self, dataloader: Any) -> int | None:
            try:
                n = len(dataloader)
            except TypeError:
                return None
            accum = self.trainer.args.gradient_accumulation_steps
            return max(n // accum + int(n % accum > 0), 1)

        def digests(self, rng: str | None) -> dict[str, str]:
            t = self.trainer
            s = t.state
            out = {"model": probe.digest(t.model.state_dict()),
                   "trainer_state": probe.digest({k: getattr(s, k, None) for k in (
                       "global_step", "epoch", "total_flos", "num_input_tokens_seen",
                       "best_metric", "best_global_step")})}
            if t.optimizer is not None:
                out["optimizer"] = probe.digest(t.optimizer.state_dict())
            if t.lr_scheduler is not None:
                out["lr_scheduler"] = probe.digest(t.lr_scheduler.state_dict())
            if rng is not None:
                out["rng"] = rng
            out["data"] = probe.digest(self.data_position())
            return out

        def data_position(self) -> dict[str, int]:
            epoch, offset = self.epoch, self.offset
            per_epoch = self.nupe * self.global_batch() if self.nupe else None
            if per_epoch and offset >= per_epoch:
                epoch, offset = epoch + 1, 0
            return {"epoch": epoch, "samples": offset}

        def emit_load(self) -> None:
            if self.pending_load is None:
                return
            digest, self.pending_load = self.pending_load, None
            digest.setdefault("rng", rng_digest())
            self.run.checkpoint_loaded(self.loaded_step, digest, per_rank=PER_RANK,
                                       world_size=self.trainer.args.world_size,
                                       digest_at="restore")

        # -- callbacks ---------------------------------------------------------------------
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.nupe = self.steps_per_epoch(kw.get("train_dataloader"))
            gs = state.global_step
            if gs and self.nupe:
                self.epoch = gs // self.nupe
                skipped = 0 if args.ignore_data_skip else gs % self.nupe
                self.offset = skipped * self.global_batch()
            budget = self.max_rewind_steps
            if budget is None:
                strategy = str(getattr(args.save_strategy, "value", args.save_strategy))
                if strategy == "steps":
                    budget = int(state.save_steps) if state.save_steps else state.max_steps
                elif strategy == "epoch":
                    budget = self.nupe or state.max_steps
                else:
                    budget = state.max_steps
            self.run.resumed(gs, source="checkpoint" if gs else "fresh", max_rewind_steps=budget)
            if not gs:
                self.warn_fresh_start()
            if gs:
                self.loaded_step = gs - 1
                self.pending_load = self.digests(rng=None)  # the RNG comes at its restore

        def on_epoch_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if not self.first_epoch:
                self.epoch, self.offset = self.epoch + 1, 0
            self.first_epoch = False

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.emit_load()  # the Trainer restored no RNG file before this step
            self.loss_sum = 0.0
            self.step = self.run.begin_step(state.global_step)

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if self.step is not None:
                self.step.point("optimizer")

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            s, self.step = self.step, None
            loss, stop = reduce_step(self.loss_sum, stop_wanted(self.run), args.device)
            self.offset += self.global_batch()
            if s is not None:
                s.record(loss=loss)
                self.run.end_step()
            if stop and not self.stopping:
                self.stopping = True
                notice = self.run.reshard_requested()
                self.run.note("planned_stop", step=state.global_step - 1,
                              reason="reshard" if notice else "sigterm")
                control.should_save = True
                control.should_training_stop = True
            return control

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            self.run.checkpoint_saved(state.global_step - 1, self.digests(self.saved_rng),
                                      per_rank=PER_RANK, path=str(path), world_size=args.world_size)
            self.saved_rng = None

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.emit_load()
            self.run.close()

    return ReshardCallback
