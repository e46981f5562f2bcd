"""A training loop of your own on Accelerate, with ``save_state`` / ``load_state``; the loop's
own ``for`` line is the one that changes:

    from pytest_reshard.adapters import accelerate as reshard

    accelerator = Accelerator(cpu=True)
    run = reshard.instrument(accelerator, sample_ids="sample_id", save_every=3,
                             output_dir="accelerate-out")   # before prepare
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
    for step, batch in run.steps(loader, steps):   # was: for step, batch in enumerate(loader)
        loss = model(batch)
        accelerator.backward(loss)                 # the loss recorded is what reaches backward
        opt.step(); sched.step(); opt.zero_grad()

``run.steps`` resumes from the newest complete save (``load_state``), skips the batches that
save had consumed, records each step (samples, loss, fault points), saves every ``save_every``
steps and at a planned stop, ends the loop there, and records the clean exit. Under the harness
the saves go to ``run.workdir`` whatever ``output_dir`` says (a log line says so), so the clean
reference run, which gets the same command line, never shares them.

The same, one call at a time (a loop that cannot hand its batches over):

    start = run.resume(ckpt_root)              # load_state of the newest complete save: first step
    batches = iter(accelerator.skip_first_batches(loader, start % len(loader)))
    for step in range(start, steps):
        batch = next(batches)
        with run.step(step, batch) as s:       # samples, begin/end, the agreed stop
            loss = model(batch)
            accelerator.backward(loss)
            opt.step(); sched.step(); opt.zero_grad()
            s.loss(loss)                       # recorded as the mean over ranks
        if run.should_save(step):              # every save_every steps, and at a planned stop
            accelerator.save_state(run.folder(ckpt_root, step))
        if run.stopping:                       # a planned reshard or SIGTERM: every rank agreed
            break
    run.close()

What ``instrument`` does (public Accelerate API only; tested with accelerate 1.15.0):

- registers a step counter with ``accelerator.register_for_checkpointing``, so every save holds
  the step it was taken after and a load says which step it restored;
- wraps, on the instance, ``prepare`` (each prepared optimizer's ``step`` gets the
  ``optimizer`` fault point), ``backward`` (``backward``), ``save_state`` (``checkpoint``
  before, the ``saving`` record with the digests, ``checkpoint_commit`` after this rank's
  files, then a barrier, the ``saved`` event,
  and a ``reshard-complete`` marker rank 0 writes last) and ``load_state`` (the ``loaded``
  event with the digests taken right after the restore);
- digests per rank, per component: ``model``, ``optimizer``, ``lr_scheduler`` (every prepared
  one), ``rng`` (this rank's: Accelerate saves ``random_states_{rank}.pkl``) and ``step``;
- ``run.resume(root)`` loads only a folder with the marker: a save a kill interrupted is never
  resumed from.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from pytest_reshard import probe
from pytest_reshard.adapters._common import (attach, reduce_step, require_version, rng_digest,
                                             stop_wanted)

__all__ = ["instrument", "workload", "AccelerateRun", "SUPPORTED", "TESTED", "PRELOAD", "MARKER"]

#: Where ``run.steps`` saves outside the harness when ``instrument`` is given no ``output_dir``.
DEFAULT_OUTPUT = "reshard-checkpoints"

SUPPORTED = ("1.0", "2.0")
TESTED = "1.15.0"
PRELOAD = ("accelerate", "pytest_reshard.adapters.accelerate")
PER_RANK = ("rng",)
#: The file rank 0 writes into a save folder once every rank's part is on disk.
MARKER = "reshard-complete"


def workload(name: str, script: str | Path, *, preload: Sequence[str] = (),
             replace: bool = True, **spec: Any) -> Any:
    """Register ``script`` (an Accelerate loop) as workload ``name``, Accelerate preloaded."""
    from pytest_reshard.workloads import WorkloadSpec, register

    return register(WorkloadSpec(name, script=str(script), preload=(*PRELOAD, *preload), **spec),
                    replace=replace)


class _Counter:
    """The step a save was taken after: saved with the state (``register_for_checkpointing``)."""

    def __init__(self) -> None:
        self.step = -1

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = int(state["step"])


def _value(loss: Any) -> float:
    return float(loss.detach().float().sum().item()) if hasattr(loss, "detach") else float(loss)


class _Step:
    def __init__(self, s: probe.Step) -> None:
        self.probe = s
        self.loss_sum = 0.0
        self.explicit = False       # s.loss was called: what backward saw no longer counts
        self.backward_sum = 0.0

    def loss(self, loss: Any) -> None:
        """This rank's loss of the step (summed if called per micro-batch)."""
        self.explicit = True
        self.loss_sum += _value(loss)

    @property
    def value(self) -> float:
        return self.loss_sum if self.explicit else self.backward_sum

    def point(self, phase: str) -> None:
        self.probe.point(phase)


class AccelerateRun:
    """What ``instrument`` returns: the loop's few calls, and the wrapped Accelerator."""

    def __init__(self, accelerator: Any, sample_ids: str | int | Callable[[Any], Any] | None,
                 save_every: int | None, max_rewind_steps: int | None,
                 output_dir: str | os.PathLike | None = None) -> None:
        self.accelerator = accelerator
        self.sample_ids = sample_ids
        self.save_every = save_every
        self.run = attach()
        self.counter = _Counter()
        self.stopping = False
        self.current: _Step | None = None
        self.budget = max_rewind_steps if max_rewind_steps is not None else save_every
        self.resumed = False
        self.closed = False
        self.models: list[Any] = []       # what prepare returned, by kind
        self.optimizers: list[Any] = []
        self.schedulers: list[Any] = []
        self.output_dir = self._output_dir(output_dir)
        accelerator.register_for_checkpointing(self.counter)
        self._wrap()

    def _output_dir(self, asked: str | os.PathLike | None) -> Path:
        """Where ``steps`` saves: the run's work folder under the harness (it outlives a
        generation and is this run's alone; the clean reference run has its own), else
        ``asked``."""
        work = self.run.workdir
        if work is None:
            return Path(asked or DEFAULT_OUTPUT)
        if asked is not None and Path(asked).resolve() != Path(work).resolve() and \
                self.accelerator.is_main_process:
            print(f"pytest_reshard.adapters.accelerate: under the harness the saves go to the "
                  f"run's work folder {work}, not {asked}", file=sys.stderr, flush=True)
        return Path(work)

    @property
    def workdir(self) -> Path | None:
        return self.run.workdir

    # -- the loop's calls ------------------------------------------------------------------
    def resume(self, root: str | os.PathLike) -> int:
        """``load_state`` of the newest complete save under ``root`` (a folder per save, as
        ``folder`` names them); returns the first step to run (0 without one)."""
        root = Path(root)
        done = sorted((p for p in root.glob("step-*") if (p / MARKER).exists()),
                      key=lambda p: int(p.name.split("-")[1])) if root.is_dir() else []
        if done:
            self.accelerator.load_state(str(done[-1]))
        start = self.counter.step + 1
        self.run.resumed(start, source="checkpoint" if done else "fresh",
                         max_rewind_steps=self.budget)
        self.resumed = True
        return start

    def folder(self, root: str | os.PathLike, step: int) -> str:
        return str(Path(root) / f"step-{step}")

    def steps(self, loader: Any, max_steps: int) -> Iterator[tuple[int, Any]]:
        """The loop's iterator: ``(step, batch)`` from the first step the newest complete save
        under ``output_dir`` leaves to run (the batches it consumed skipped, epoch by epoch over
        ``loader``'s length), each yielded inside its step. When the body returns the step ends
        (its loss: what reached ``accelerator.backward``), a save is made when ``should_save``
        says, and a planned stop ends the loop. Leaving the loop another way (an exception, a
        ``break``) leaves that step unended, as a crash does."""
        start = self.resume(self.output_dir) if not self.resumed else self.counter.step + 1
        try:
            per_epoch: int | None = len(loader) or None
        except TypeError:
            per_epoch = None
        epoch, skip = divmod(start, per_epoch) if per_epoch else (0, start)
        step = start
        while step < max_steps and not self.stopping:
            if callable(getattr(loader, "set_epoch", None)):
                loader.set_epoch(epoch)
            batches = self.accelerator.skip_first_batches(loader, skip) if skip else loader
            skip, taken = 0, 0
            for batch in batches:
                if step >= max_steps:
                    break
                s = self._begin(step, batch, epoch if per_epoch else None)
                try:
                    yield step, batch
                except GeneratorExit:
                    self.current = None
                    raise
                self._end(step, s)
                if self.should_save(step):
                    self.accelerator.save_state(self.folder(self.output_dir, step))
                step, taken = step + 1, taken + 1
                if self.stopping:
                    break
            if not taken:
                break   # an empty epoch: nothing more to train on
            epoch += 1
        self.close()

    @contextmanager
    def step(self, step: int, batch: Any = None, *, epoch: int | None = None) -> Iterator[_Step]:
        """One training step: records the batch's sample ids (of ``epoch``, the pass over the
        data they belong to), marks ``forward`` at the start, and at the end records the mean
        loss over ranks and agrees on a planned stop."""
        s = self._begin(step, batch, epoch)
        try:
            yield s
        except BaseException as e:
            self.current = None
            self.run.end_step(error=e)
            raise
        self._end(step, s)

    def _begin(self, step: int, batch: Any, epoch: int | None) -> _Step:
        if not self.resumed:
            self.run.resumed(step, source="fresh", max_rewind_steps=self.budget)
            self.resumed = True
        s = _Step(self.run.begin_step(step))
        self.current = s
        if batch is not None and self.sample_ids is not None:
            ids = self.sample_ids(batch) if callable(self.sample_ids) else batch[self.sample_ids]
            ids = [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]
            s.probe.record(samples=ids, **({"epoch": epoch} if epoch is not None else {}))
        s.point("forward")
        return s

    def _end(self, step: int, s: _Step) -> None:
        self.current = None
        loss, stop = reduce_step(s.value, stop_wanted(self.run), self.accelerator.device)
        s.probe.record(loss=loss)
        self.run.end_step()
        self.counter.step = step
        if stop and not self.stopping:
            self.stopping = True
            self.run.note("planned_stop", step=step,
                          reason="reshard" if self.run.reshard_requested() else "sigterm")

    def should_save(self, step: int) -> bool:
        return self.stopping or bool(self.save_every and (step + 1) % self.save_every == 0)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.run.close()

    # -- digests ---------------------------------------------------------------------------
    def digests(self, rng: str) -> dict[str, str]:
        a = self.accelerator
        return {"model": probe.digest([a.unwrap_model(m).state_dict() for m in self.models]),
                "optimizer": probe.digest([o.state_dict() for o in self.optimizers]),
                "lr_scheduler": probe.digest([s.state_dict() for s in self.schedulers]),
                "rng": rng, "step": probe.digest(self.counter.step)}

    # -- wrapping (public methods, on the instance) ------------------------------------------
    def _wrap(self) -> None:
        a = self.accelerator
        prepare, backward, save_state, load_state = a.prepare, a.backward, a.save_state, a.load_state

        def wrapped_prepare(*args: Any, **kwargs: Any) -> Any:
            import torch

            out = prepare(*args, **kwargs)
            for obj in (out if isinstance(out, tuple) else (out,)):
                if isinstance(obj, torch.nn.Module):
                    self.models.append(obj)
                elif hasattr(obj, "scheduler") and callable(getattr(obj, "state_dict", None)):
                    self.schedulers.append(obj)
                elif hasattr(obj, "optimizer") and callable(getattr(obj, "step", None)):
                    self.optimizers.append(obj)
                    self._wrap_optimizer(obj)
            return out

        def wrapped_backward(loss: Any, **kwargs: Any) -> Any:
            if self.current is not None:
                self.current.backward_sum += _value(loss)
                self.current.point("backward")
            return backward(loss, **kwargs)

        def wrapped_save_state(output_dir: Any = None, *args: Any, **kwargs: Any) -> Any:
            step = self.counter.step
            self.run.point("checkpoint", step=step)
            rng = rng_digest()          # what random_states_{rank}.pkl will hold
            digest = self.digests(rng)
            self.run.checkpoint_saving(step, digest, per_rank=PER_RANK)
            out = save_state(output_dir, *args, **kwargs)
            self.run.point("checkpoint_commit", step=step)
            a.wait_for_everyone()       # every rank's part is on disk
            folder = Path(out if isinstance(out, (str, os.PathLike)) else output_dir)
            self.run.checkpoint_saved(step, digest, per_rank=PER_RANK, path=str(folder),
                                      world_size=a.num_processes)
            if a.is_main_process:
                (folder / MARKER).touch()
            a.wait_for_everyone()
            return out

        def wrapped_load_state(input_dir: Any = None, *args: Any, **kwargs: Any) -> Any:
            out = load_state(input_dir, *args, **kwargs)
            self.run.checkpoint_loaded(self.counter.step, self.digests(rng_digest()),
                                       per_rank=PER_RANK, path=str(input_dir),
                                       world_size=a.num_processes, digest_at="restore")
            return out

        a.prepare, a.backward = wrapped_prepare, wrapped_backward
        a.save_state, a.load_state = wrapped_save_state, wrapped_load_state

    def _wrap_optimizer(self, opt: Any) -> None:
        step = opt.step

        def wrapped_step(*args: Any, **kwargs: Any) -> Any:
            if self.current is not None:
                self.current.point("optimizer")
            return step(*args, **kwargs)

        opt.step = wrapped_step
        opt._reshard_wrapped = True


def instrument(accelerator: Any, sample_ids: str | int | Callable[[Any], Any] | None = "sample_id",
               *, save_every: int | None = None, max_rewind_steps: int | None = None,
               output_dir: str | os.PathLike | None = None) -> AccelerateRun:
    """Connect ``accelerator`` to the harness; call it before ``accelerator.prepare``.
    ``save_every``: the save interval (``run.should_save``), and by default
    ``max_rewind_steps``. ``output_dir``: where ``run.steps`` saves outside the harness (under
    it, the run's work folder)."""
    import accelerate

    require_version("accelerate", accelerate.__version__, SUPPORTED, TESTED)
    return AccelerateRun(accelerator, sample_ids, save_every, max_rewind_steps, output_dir)
