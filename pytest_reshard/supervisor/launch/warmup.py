"""Imported by the fork server before it forks any rank: pay torch's lazy imports once.

Constructing the first optimizer imports torch._dynamo (about 3 s on 2 cores); distributed
checkpointing and FSDP pull in more. Doing it here makes every forked rank start warm. The
server runs single-threaded (one intra-op thread, no parallel region ever entered), so forking
it stays safe.
"""
import torch

torch.set_num_threads(1)

import torch.distributed  # noqa: E402
import torch.distributed.checkpoint  # noqa: E402,F401
import torch.distributed.checkpoint.state_dict  # noqa: E402,F401
import torch.distributed.fsdp  # noqa: E402,F401

_model = torch.nn.Linear(2, 1)
_opt = torch.optim.AdamW(_model.parameters())
_model(torch.ones(1, 2)).sum().backward()
_opt.step()
del _model, _opt
