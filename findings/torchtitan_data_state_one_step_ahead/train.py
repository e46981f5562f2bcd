"""A user's loop on torchtitan's fault-tolerance stack, as torchtitan's FT trainer composes it:
torchtitan 0.3.0's ``TorchFTManager`` (a real torchft 0.2.0 ``Manager``, with a Lighthouse this
script hosts), ``TorchFTOptimizersContainer``, ``LRSchedulersContainer``,
``ParallelAwareDataloader`` and ``TorchFTCheckpointManager``; one replica group of 2 gloo ranks
(plain DDP inside it), a checkpoint every step (``interval=1``).

The bug (pytorch/torchtitan#4686, torchtitan 0.3.0): ``TorchFTCheckpointManager.save`` writes the
data loader's state to the replica's own folder (``ft-replicat-0/step-N``) and then the model,
optimizer and train state to ``step-N``: two saves. A job killed between them restarts with
``load()``, which takes the newest data-loader step in the replica folder on its own, before the
main checkpoint's step is chosen: the model of step N-1 with the data position of step N, and the
batch of step N is never trained. ``--fixed``: #4686's fix, the data loader's step bounded by the
main checkpoint's (a subclass written from the PR's description; 0.3.0 predates it)."""
import argparse
import os
import re
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.stateful import Stateful
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import IterableDataset

from pytest_reshard import probe

p = argparse.ArgumentParser()
p.add_argument("--fixed", action="store_true")
p.add_argument("--steps", type=int, default=int(os.environ.get("RESHARD_STEPS", 8)))
p.add_argument("--per-rank", type=int, default=2)
args = p.parse_args()

run = probe.attach(max_rewind_steps=1)
run.stop_requested()

from torchft.coordination import LighthouseServer  # noqa: E402  (after attach: seconds to import)
from torchtitan.components.dataloader import ParallelAwareDataloader  # noqa: E402
from torchtitan.components.optimizer import LRSchedulersContainer  # noqa: E402
from torchtitan.components.optimizer.optimizer import ParamGroupConfig  # noqa: E402
from torchtitan.experiments.torchft.checkpoint import TorchFTCheckpointManager  # noqa: E402
from torchtitan.experiments.torchft.manager import TorchFTManager  # noqa: E402
from torchtitan.experiments.torchft.optimizer import TorchFTOptimizersContainer  # noqa: E402

dist.init_process_group("gloo")   # the replica group: every rank of this job
rank, world = dist.get_rank(), dist.get_world_size()
lighthouse = None
if rank == 0:   # torchft's Manager of group rank 0 asks the Lighthouse for the quorum
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1)
    os.environ["TORCHFT_LIGHTHOUSE"] = lighthouse.address()
ft = TorchFTManager(TorchFTManager.Config(enable=True, replica_id=0, group_size=1,
                                          min_replica_size=1))
dp_world, dp_rank = ft.get_dp_info(world, rank)
N = 256


class Samples(IterableDataset, Stateful):
    """This data-parallel rank's share of the sample ids, with its position in ``state_dict``
    (torchtitan's text datasets keep ``sample_idx`` the same way)."""

    def __init__(self):
        self.ids, self.pos = list(range(dp_rank, N, dp_world)), 0

    def __iter__(self):
        while self.pos < len(self.ids):
            self.pos += 1
            yield self.ids[self.pos - 1]

    def state_dict(self):
        return {"sample_idx": self.pos}

    def load_state_dict(self, state):
        self.pos = state["sample_idx"]


class TrainState(Stateful):
    def __init__(self):
        self.step = 0

    def state_dict(self):
        return {"step": torch.tensor(self.step)}

    def load_state_dict(self, state):
        self.step = int(state["step"])


class Checkpointer(TorchFTCheckpointManager):
    """torchtitan's manager as it is, plus the probe's records: the ``checkpoint`` point as the
    main save begins (the data loader's save of that step is already on disk) and the save."""

    def dcp_save(self, state_dict, checkpoint_id, async_mode, **kw):
        if not checkpoint_id.startswith(self._ft_folder()):
            run.point("checkpoint", step=train_state.step - 1)
        return super().dcp_save(state_dict, checkpoint_id, async_mode, **kw)

    def _save(self, curr_step, last_step=False):
        saved = super()._save(curr_step, last_step)
        if saved:
            run.checkpoint_saved(curr_step - 1, digests(), per_rank="data")
        return saved


class FixedCheckpointer(Checkpointer):
    """pytorch/torchtitan#4686: the data loader's step is the newest one no later than the step
    the main checkpoint is loaded from."""

    def _ft_load(self):
        main = self._find_load_step()
        folder = Path(self._ft_folder())
        steps = [int(m.group(1)) for d in folder.glob("step-*")
                 if (m := re.fullmatch(r"step-(\d+)", d.name)) and (d / ".metadata").is_file()]
        steps = [s for s in steps if s <= main]
        if steps:
            self.dcp_load(self.ft_states, checkpoint_id=self._create_checkpoint_id(
                max(steps), folder=self._ft_folder()), from_hf=False, from_quantized=False)


torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
model = DDP(net)
optimizers = TorchFTOptimizersContainer(
    TorchFTOptimizersContainer.Config(
        param_groups=[ParamGroupConfig(pattern=".*", optimizer_name="AdamW",
                                       optimizer_kwargs={"lr": 0.05})],
        implementation="for-loop"),
    model_parts=[net], ft_manager=ft)
# A constant LR: torchtitan 0.3.0's TorchFTOptimizersContainer saves the learning rate it cached
# at its start (pytorch/torchtitan#4598), a bug of its own that a schedule would show as well.
lr_schedulers = LRSchedulersContainer.Config(warmup_steps=0, decay_ratio=0.0).build(
    optimizers=optimizers, training_steps=args.steps)
loader = ParallelAwareDataloader(Samples(), dp_rank=dp_rank, dp_world_size=dp_world,
                                 batch_size=args.per_rank)
train_state = TrainState()
checkpointer = (FixedCheckpointer if args.fixed else Checkpointer)(
    TorchFTCheckpointManager.Config(enable=True, folder="checkpoint", interval=1,
                                    last_save_model_only=False),
    dataloader=loader, model_parts=[net], optimizers=optimizers, lr_schedulers=lr_schedulers,
    states={"train_state": train_state}, sd_adapter=None,
    base_folder=str(run.workdir or "titan-ft-out"), ft_manager=ft)


def digests() -> dict[str, str]:
    inner = optimizers.optimizers[0].state_dict()
    return {"model": probe.digest(net.state_dict()),
            "optimizer": probe.digest([inner["state"], [g["lr"] for g in inner["param_groups"]]]),
            "lr_scheduler": probe.digest(lr_schedulers.state_dict()),
            "train_state": probe.digest(train_state.step),
            "data": probe.digest(loader.state_dict())}


if checkpointer.load():   # the newest checkpoint, as torchtitan's trainer does at its start
    run.checkpoint_loaded(train_state.step - 1, digests(), per_rank="data")
start = train_state.step
run.resumed(step=start, source="checkpoint" if start else "fresh")
batches = iter(loader)
for step in range(start, args.steps):   # harness step; torchtitan's step is step + 1
    with run.step(step) as s:
        optimizers.zero_grad()           # torchft: the quorum
        ids = next(batches)
        s.record(samples=ids.tolist())
        x = torch.stack([torch.tensor([float(i % 7), float(i % 5), 1.0, float(i % 3)])
                         for i in ids.tolist()])
        s.point("forward")
        loss = ((model(x).squeeze(1) - x.sum(1)) ** 2).mean()
        s.point("backward")
        loss.backward()
        s.point("optimizer")
        optimizers.step()                # torchft: should_commit, then AdamW
        lr_schedulers.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        s.record(loss=float(total) / world)
    train_state.step = step + 1
    run.state_after(step, digests())
    stop = run.stop_requested() or run.reshard_requested()
    checkpointer.save(train_state.step, last_step=stop or train_state.step == args.steps)
    if stop:
        break
checkpointer.maybe_wait_for_saving()
checkpointer.close()
run.close()
ft.manager.shutdown(wait=False)
dist.barrier()
if lighthouse is not None:
    lighthouse.shutdown()
dist.destroy_process_group()
