"""Imported by the fork server before it forks any rank: pay torch's lazy imports once.

Constructing the first optimizer imports torch._dynamo (about 3 s on 2 cores); distributed
checkpointing and FSDP pull in more. Doing it here makes every forked rank start warm. The
server runs single-threaded (one intra-op thread, no parallel region ever entered), so forking
it stays safe.

Paying an import early must not change what the script sees, and one does: see
``_keep_default_group``.
"""
from typing import Any

import torch

torch.set_num_threads(1)

import torch.distributed  # noqa: E402
import torch.distributed.checkpoint  # noqa: E402,F401
import torch.distributed.checkpoint.state_dict  # noqa: E402,F401
import torch.distributed.fsdp  # noqa: E402,F401
# What the first dcp.save or dcp.load imports in every rank (about 0.1 s on 2 cores): the storage
# reader/writer probe imports fsspec's filesystem when fsspec is installed, and the storage
# layer torch.utils.serialization's config.
import torch.utils.serialization.config  # noqa: E402,F401

try:
    import torch.distributed.checkpoint._fsspec_filesystem  # noqa: E402,F401
except ImportError:  # fsspec is optional to torch
    pass
# The fault kinds: a rank's probe imports the executors of its plan's faults at attach. A kind
# that fails to import fails in the rank that needs it, with its own traceback, as it would cold.
try:
    import pytest_reshard.chaos  # noqa: E402,F401
except Exception:
    pass

_model = torch.nn.Linear(2, 1)
_opt = torch.optim.AdamW(_model.parameters())
# On a build with CUDA, the first backward initialises the CUDA driver and starts a worker thread
# per GPU, and the first step asks the driver whether a graph is being captured: a server with
# threads, or with a CUDA context, cannot fork ranks that use the GPU. There each rank pays its
# own first backward and step (about 10 ms).
if not torch.backends.cuda.is_built():
    _model(torch.ones(1, 2)).sum().backward()
    _opt.step()
del _model, _opt

#: Every default process group a forked rank created, held until its interpreter exits.
_DEFAULT_GROUPS: list[Any] = []


def _keep_default_group() -> None:
    """Hold each default process group until the interpreter exits, as a cold rank does.

    In a cold DDP rank, ``DistributedDataParallel(...)`` is what first imports torch._dynamo,
    and with it torch.distributed.nn, whose functions take ``group=group.WORLD`` as a default
    argument: evaluated at that import, with the group live, it holds the default group until
    the interpreter exits. This warm-up imports both before any group exists, so in a forked
    rank nothing else holds it, and freeing the DDP model (``main()`` returning, ``del model``)
    destroys the gloo group right there, with the GIL held (the reducer's destructor):
    ``~ProcessGroupGloo`` joins a worker thread that is still releasing the tensors of its last
    collective and waits for the GIL. That is a deadlock (torch's: a cold script that imports
    torch.distributed.checkpoint before ``init_process_group`` has it too); the probe's
    heartbeat thread then waits for the GIL as well, and the rank reads as stopped at its last
    step. Where a cold rank frees the group, in the interpreter's finalization, a thread that
    wants the GIL exits instead of waiting, so that destructor cannot deadlock there; it can
    abort ("terminate called without an active exception"), which the supervisor reads as the
    clean exit it is once the probe recorded ``exit``.
    """
    c10d = torch.distributed.distributed_c10d
    world = type(getattr(c10d, "_world", None))
    slot = world.__dict__.get("default_pg")
    if not isinstance(slot, property) or slot.fset is None:
        return  # another torch: nothing known to mirror
    setter = slot.fset

    def keep(self: Any, pg: Any) -> None:
        if isinstance(pg, c10d.ProcessGroup):
            _DEFAULT_GROUPS.append(pg)
        setter(self, pg)

    # world is torch's private _World class (its default_pg property was found above)
    world.default_pg = property(slot.fget, keep, slot.fdel, slot.__doc__)  # type: ignore[union-attr]


if torch.distributed.is_available():
    _keep_default_group()
