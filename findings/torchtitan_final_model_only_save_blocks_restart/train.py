"""A user's torchtitan 0.3.0 script: its own Trainer on the llama3 debug model (2 of its 6 layers;
FSDP2, its HF text data loader, its DCP CheckpointManager saving every 3 steps), on CPU with gloo,
and the harness's line ``torchtitan.instrument(trainer)``. Nothing downloads: the tokenizer (a
word-level ``tokenizer.json``) and the text (a ``c4_test``-shaped JSON file) are written locally.

The bug (torchtitan 0.3.0, its defaults): ``last_save_model_only=True`` makes the final step's
save, ``step-8/``, hold the model alone ("we assume training is fully complete"), yet
``CheckpointManager`` resumes from the newest ``step-N/`` with a ``.metadata``, taking it as a full
checkpoint. A job restarted with the same command after that save (a rank lost in teardown, the
scheduler's retry), which is what torchtitan's fault-tolerance branch promises to handle, dies in
the load: "Missing key in checkpoint state_dict: dataloader.dp_rank_N". ``--fixed``:
``last_save_model_only=False``, what torchtitan's own llama3 debug configuration sets, so the final
save is a full one and the restart finds nothing left to train.
"""
import argparse
import json
import os
import random
import tempfile
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pytest_reshard.adapters import torchtitan_cpu  # noqa: E402,F401  (before torchtitan.trainer)
from pytest_reshard.adapters import torchtitan  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--fixed", action="store_true")
p.add_argument("--steps", type=int, default=int(os.environ.get("RESHARD_STEPS", 8)))
p.add_argument("--assets", default=os.environ.get(
    "TITAN_ASSETS", str(Path(tempfile.gettempdir()) / "reshard-titan-assets")))
args = p.parse_args()

WORDS, DOCS = 500, 200


def write_assets(folder: Path) -> None:
    """A word-level tokenizer over WORDS words and DOCS documents, written atomically (every rank
    may get here first; the content is the same)."""
    if (folder / "done").exists():
        return
    from tokenizers import Tokenizer, models, pre_tokenizers

    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    (tmp / "tokenizer").mkdir(parents=True)
    (tmp / "text").mkdir()
    vocab = {"<unk>": 0, "<bos>": 1, "<eos>": 2, **{f"w{i}": 3 + i for i in range(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp / "tokenizer" / "tokenizer.json"))
    (tmp / "tokenizer" / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<bos>", "eos_token": "<eos>"}))
    with open(tmp / "text" / "data.json", "w") as f:
        for i in range(DOCS):
            rng = random.Random(i)
            words = [f"w{i % WORDS}"] + [f"w{rng.randrange(WORDS)}"
                                         for _ in range(rng.randrange(20, 60))]
            f.write(json.dumps({"text": " ".join(words)}) + "\n")
    (tmp / "done").write_text("")
    try:
        os.rename(tmp, folder)
    except OSError:  # another rank was first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


assets = Path(args.assets)
write_assets(assets)
os.environ.setdefault("HF_DATASETS_CACHE", str(assets / "hf-cache"))

from torchtitan.components.checkpoint import CheckpointManager  # noqa: E402
from torchtitan.config import (CommConfig, DebugConfig, ParallelismConfig,  # noqa: E402
                               TrainingConfig)
from torchtitan.models.common.attention import ScaledDotProductAttention  # noqa: E402
from torchtitan.models.llama3.config_registry import llama3_debugmodel  # noqa: E402

config = llama3_debugmodel()
config.model_spec.model.layers = config.model_spec.model.layers[:2]  # of 6: CPU time
# FlexAttention has no CPU backward, and model_registry refuses "sdpa": set it per layer.
for layer in config.model_spec.model.layers:
    layer.attention.inner_attention = ScaledDotProductAttention.Config()
config.hf_assets_path = str(assets / "tokenizer")
config.dump_folder = "titan-out"  # under the harness the adapter saves in the run's work folder
config.dataloader.dataset_path = str(assets / "text")
config.training = TrainingConfig(local_batch_size=2, seq_len=32, steps=args.steps,
                                 mixed_precision_param="float32", disable_cuda_graphs=True)
config.parallelism = ParallelismConfig(spmd_backend="partial_dtensor")
config.activation_checkpoint = None
config.validator.enable = False
config.comm = CommConfig(init_timeout_seconds=60, train_timeout_seconds=60, trace_buf_size=0)
config.debug = DebugConfig(seed=0, enable_structured_logging=False)
# torchtitan's default is last_save_model_only=True (the debug config sets False: undo that).
config.checkpoint = CheckpointManager.Config(enable=True, interval=3,
                                             last_save_model_only=not args.fixed)

trainer = config.build()
torchtitan.instrument(trainer)
try:
    trainer.train()
finally:
    trainer.close()
import torch.distributed as dist  # noqa: E402

if dist.is_initialized():
    dist.destroy_process_group()
