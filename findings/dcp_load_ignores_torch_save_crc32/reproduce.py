"""DCP's loader and torch.save's CRC-32, without the harness, in one process: save a small
model's state with ``dcp.save`` after step 1 and after step 2, flip one byte of a weight inside
step 2's ``.distcp`` file (what a bad disk or a bad copy does), and ``dcp.load`` it. The record
is a ``torch.save`` archive with a CRC-32 for every entry, and ``zipfile`` finds the broken one,
but torch's zip reader is built with its CRC checks off, so the load gives back the flipped
weight without a word. Exits 1 when the load returns a state that is not what was saved (the
bug), or 0 with ``--fixed``: the user's own digest of the state, written beside each checkpoint
at the save and checked at the load, rejects step 2 and falls back to step 1, which loads
correctly."""
import hashlib
import io
import json
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader

fixed = "--fixed" in sys.argv
warnings.filterwarnings("ignore", message="torch.distributed is disabled")   # one process
torch.manual_seed(0)
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def digest(state: dict[str, torch.Tensor]) -> dict[str, str]:
    return {k: hashlib.sha256(v.detach().contiguous().view(torch.uint8).numpy()).hexdigest()
            for k, v in state.items()}


def save(folder: Path) -> dict[str, torch.Tensor]:
    state = {k: v.clone() for k, v in model.state_dict().items()}
    dcp.save({"model": model.state_dict()}, checkpoint_id=folder)
    if fixed:   # the user's fix: a digest of what was saved, beside it
        (folder / "digest.json").write_text(json.dumps(digest(state)))
    return state


def load(folder: Path) -> dict[str, torch.Tensor] | None:
    state = {"model": {k: torch.zeros_like(v) for k, v in model.state_dict().items()}}
    dcp.load(state, checkpoint_id=folder)
    if fixed:
        expected = json.loads((folder / "digest.json").read_text())
        bad = [k for k, d in digest(state["model"]).items() if expected.get(k) != d]
        if bad:
            print(f"{folder.name}: {', '.join(bad)} does not match its digest: not loaded")
            return None
    return state["model"]


def step() -> None:
    model(torch.randn(8, 64)).square().mean().backward()
    opt.step()
    opt.zero_grad()


root = tempfile.TemporaryDirectory()
saved = {}
for n in (1, 2):
    step()
    saved[n] = save(Path(root.name) / f"step-{n}")

# Flip one byte in the middle of step 2's weight, where DCP stored it (its record in the file).
folder = Path(root.name) / "step-2"
metadata = FileSystemReader(str(folder)).read_metadata()
record = next(info for index, info in metadata.storage_data.items() if index.fqn == "model.weight")
path = folder / record.relative_path
raw = bytearray(path.read_bytes())
data = bytes(saved[2]["weight"].contiguous().view(torch.uint8).numpy())
at = raw.find(data, record.offset, record.offset + record.length)
assert at >= 0, "DCP stores the tensor's bytes verbatim inside its torch.save record"
raw[at + len(data) // 2] ^= 0x01
path.write_bytes(raw)
archive = zipfile.ZipFile(io.BytesIO(bytes(raw[record.offset:record.offset + record.length])))
print(f"torch {torch.__version__}: flipped one bit of model.weight in {path.name}; the CRC-32 "
      f"torch.save wrote for it no longer matches (zipfile: bad entry {archive.testzip()!r})")

loaded, which = None, None
for n in (2, 1):   # the newest checkpoint first
    loaded = load(Path(root.name) / f"step-{n}")
    if loaded is not None:
        which = n
        break
root.cleanup()
if loaded is None:
    print("no checkpoint passed its digest")
    sys.exit(1)
wrong = [k for k in loaded if not torch.equal(loaded[k], saved[which][k])]
if wrong:
    i = int((loaded["weight"] != saved[which]["weight"]).reshape(-1).nonzero()[0])
    print(f"dcp.load of step-{which} raised nothing, and returned {', '.join(wrong)} different "
          f"from what was saved (element {i}: saved "
          f"{saved[which]['weight'].view(-1)[i].item()!r}, loaded "
          f"{loaded['weight'].view(-1)[i].item()!r})")
    sys.exit(1)
print(f"loaded step-{which}: every tensor is what was saved")
sys.exit(0)
