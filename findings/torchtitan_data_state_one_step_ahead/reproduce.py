"""pytorch/torchtitan#4686 without the harness, the report's example: torchtitan 0.3.0's
TorchFTCheckpointManager (with a real torchft Manager and Lighthouse, one gloo process) saves the
data loader every step and the model every 3 steps. A first job trains 4 steps and ends there, as
a job that crashes in step 5 does: ``step-3`` holds the model, ``ft-replicat-0/step-4`` the data
loader. A second job starts with ``load()``, as torchtitan's trainer does. Exits 1 when it resumes
the model of step 3 with the data position of step 4 (the bug: batch 4 is never trained), or 0
with ``--fixed`` (#4686: the data loader's step bounded by the main checkpoint's)."""
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

fixed = "--fixed" in sys.argv


def job(folder: str, steps: int) -> None:
    """One job of 1 process: resume from ``folder`` if it holds a checkpoint, train to ``steps``,
    print what it resumed and which batches it trained."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.stateful import Stateful
    from torch.utils.data import IterableDataset
    from torchft.coordination import LighthouseServer
    from torchtitan.components.dataloader import ParallelAwareDataloader
    from torchtitan.components.optimizer import LRSchedulersContainer
    from torchtitan.components.optimizer.optimizer import ParamGroupConfig
    from torchtitan.experiments.torchft.checkpoint import TorchFTCheckpointManager
    from torchtitan.experiments.torchft.manager import TorchFTManager
    from torchtitan.experiments.torchft.optimizer import TorchFTOptimizersContainer

    class Samples(IterableDataset, Stateful):
        def __init__(self):
            self.pos = 0

        def __iter__(self):
            while self.pos < 64:
                self.pos += 1
                yield self.pos - 1

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

    class FixedCheckpointer(TorchFTCheckpointManager):   # pytorch/torchtitan#4686
        def _ft_load(self):
            main = self._find_load_step()
            steps = [int(m.group(1)) for d in Path(self._ft_folder()).glob("step-*")
                     if (m := re.fullmatch(r"step-(\d+)", d.name))
                     and (d / ".metadata").is_file() and int(m.group(1)) <= main]
            if steps:
                self.dcp_load(self.ft_states, checkpoint_id=self._create_checkpoint_id(
                    max(steps), folder=self._ft_folder()), from_hf=False, from_quantized=False)

    dist.init_process_group("gloo")
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1)
    os.environ["TORCHFT_LIGHTHOUSE"] = lighthouse.address()
    ft = TorchFTManager(TorchFTManager.Config(enable=True, replica_id=0, group_size=1))
    torch.manual_seed(0)
    net = torch.nn.Linear(1, 1)
    optimizers = TorchFTOptimizersContainer(
        TorchFTOptimizersContainer.Config(
            param_groups=[ParamGroupConfig(pattern=".*", optimizer_name="AdamW",
                                           optimizer_kwargs={"lr": 0.01})],
            implementation="for-loop"),
        model_parts=[net], ft_manager=ft)
    lr_schedulers = LRSchedulersContainer.Config(warmup_steps=0, decay_ratio=0.0).build(
        optimizers=optimizers, training_steps=steps)
    loader = ParallelAwareDataloader(Samples(), dp_rank=0, dp_world_size=1, batch_size=2)
    train_state = TrainState()
    checkpointer = (FixedCheckpointer if fixed else TorchFTCheckpointManager)(
        TorchFTCheckpointManager.Config(enable=True, folder="checkpoint", interval=3,
                                        last_save_model_only=False),
        dataloader=loader, model_parts=[net], optimizers=optimizers,
        lr_schedulers=lr_schedulers, states={"train_state": train_state}, sd_adapter=None,
        base_folder=folder, ft_manager=ft)
    if checkpointer.load():
        print(f"RESUMED {train_state.step}", flush=True)
    batches = iter(loader)
    while train_state.step < steps:
        optimizers.zero_grad()
        ids = next(batches)
        net(ids.float().unsqueeze(1)).sum().backward()
        optimizers.step()
        lr_schedulers.step()
        train_state.step += 1
        print(f"TRAINED {train_state.step} {ids.tolist()}", flush=True)
        checkpointer.save(train_state.step)   # the data loader every step, the model every 3
    checkpointer.maybe_wait_for_saving()
    checkpointer.close()
    ft.manager.shutdown(wait=False)
    lighthouse.shutdown()
    dist.destroy_process_group()


def start(folder: str, steps: int) -> list[str]:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0",
           "WORLD_SIZE": "1", "OMP_NUM_THREADS": "1", "RUST_LOG": "error"}
    done = subprocess.run([sys.executable, __file__, "--job", folder, str(steps),
                           *(["--fixed"] if fixed else [])], env=env, capture_output=True,
                          text=True, timeout=100)   # 14 s alone on 2 busy cores, 7x
    if done.returncode:
        sys.exit(f"the job failed:\n{done.stdout}{done.stderr}")
    return [line for line in done.stdout.splitlines() if line.startswith(("RESUMED", "TRAINED"))]


if __name__ == "__main__":
    if "--job" in sys.argv:
        at = sys.argv.index("--job")
        job(sys.argv[at + 1], int(sys.argv[at + 2]))
        sys.exit(0)
    with tempfile.TemporaryDirectory() as out:
        first = start(out, 4)        # ends after step 4: a crash in step 5
        print("first job:", "; ".join(first))
        held = sorted(d.name for d in Path(out, "checkpoint").glob("step-*"))
        replica = sorted(d.name for d in Path(out, "checkpoint", "ft-replicat-0").glob("step-*"))
        print(f"main checkpoints: {held}; the replica's data-loader checkpoints: {replica}")
        second = start(out, 6)
        print("second job:", "; ".join(second))
    resumed = int(second[0].split()[1]) if second and second[0].startswith("RESUMED") else 0
    batch = next(line.split(" ", 2)[2] for line in second if line.startswith("TRAINED"))
    expected = first[resumed].split(" ", 2)[2] if resumed < len(first) else None
    print(f"resumed the model and train state of step {resumed}: its next step trained the "
          f"samples {batch}, the first job's step {resumed + 1} trained {expected}")
    if batch == expected:
        sys.exit(0)
    print(f"the data loader resumed from a later step than the model: the samples {expected} "
          "are never trained")
    sys.exit(1)
