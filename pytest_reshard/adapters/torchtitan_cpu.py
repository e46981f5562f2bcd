"""torchtitan 0.3.0 on CPU with gloo: the few patches it takes, applied when this module is
imported (before anything imports ``torchtitan.trainer``; the torchtitan workload's fork server
preloads it first). Not needed on GPUs with NCCL.

Each patch names the upstream problem. What it does not patch is a configuration choice the
script makes (``attn_backend="sdpa"``, ``spmd_backend="partial_dtensor"``, float32 parameters,
``disable_cuda_graphs``): see docs/guide/frameworks.md, torchtitan.
"""
from __future__ import annotations

import sys
import types
from typing import Any

__all__ = ["apply", "PATCHES"]

#: What each patch works around, for the docs and the report.
PATCHES = {
    "triton": "torchtitan imports triton unconditionally (distributed/minimal_async_ep/kernels.py) "
              "but does not declare it; the MoE kernels module is replaced by one that raises if used",
    "device": "tools/utils.py falls back to device_type 'cuda' when no accelerator exists; "
              "set to 'cpu' (torch.cpu, plus the memory-statistics calls its metrics make) before other "
              "modules copy it",
    "set_pg_timeouts": "distributed/utils.py calls torch.distributed.set_timeout (absent in torch "
                       "2.13) after a barrier on an accelerator's device_ids; kept as a plain barrier",
    "fsdp_premul_sum": "distributed/fsdp.py sets FSDP2's gradient divide factor to 1.0, which "
                       "reduce-scatters with PREMUL_SUM, a reduction gloo lacks; on gloo FSDP2 is "
                       "told to reduce with SUM (the same sum, factor 1)",
}

_KERNELS = "torchtitan.distributed.minimal_async_ep.kernels"
_KERNEL_NAMES = ("copy_full_counts_to_peers_kernel", "copy_rows_to_peers_kernel",
                 "expand_topk_grad_kernel", "fill_combine_metadata_kernel",
                 "fill_dispatch_metadata_kernel", "invert_flat_indices_kernel",
                 "reduce_topk_slots_kernel", "topk_scores_grad_kernel")


def _no_triton(name: str) -> Any:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{name} is a triton kernel (torchtitan's MoE expert parallelism); "
                           "triton is not installed: install it or do not use expert parallelism")
    return kernel


def _cpu_device_module(torch: Any) -> types.ModuleType:
    """``torch.cpu`` plus the memory-statistics calls torchtitan's metrics make of a device
    module (``get_device_name``, ``get_device_properties``, ``memory_stats``...), answered for
    a CPU: no device memory to report."""
    import os

    mod = types.ModuleType("pytest_reshard.adapters.torchtitan_cpu.device")
    mod.__dict__.update({k: v for k, v in vars(torch.cpu).items() if not k.startswith("__")})
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    mod.__dict__.update(
        get_device_name=lambda device=None: "cpu",
        get_device_properties=lambda device=None: types.SimpleNamespace(total_memory=total),
        memory_stats=lambda device=None: {},
        reset_peak_memory_stats=lambda device=None: None,
        empty_cache=lambda: None)
    return mod


def apply() -> None:
    """Install the patches (idempotent). Call it before importing ``torchtitan.trainer``."""
    import importlib.util

    import torch

    # torchtitan/distributed/minimal_async_ep/kernels.py: `import triton` at the top, triton not
    # in torchtitan's requirements (upstream bug).
    if importlib.util.find_spec("triton") is None and _KERNELS not in sys.modules:
        stub = types.ModuleType(_KERNELS)
        stub.__doc__ = "pytest_reshard.adapters.torchtitan_cpu: triton is not installed"
        for name in _KERNEL_NAMES:
            setattr(stub, name, _no_triton(name))
        sys.modules[_KERNELS] = stub

    # torchtitan/tools/utils.py: `_get_available_device_type() or "cuda"` assumes a GPU
    # (upstream bug: CPU is never chosen, torch.cuda.set_device then fails).
    from torchtitan.tools import utils

    if not torch.cuda.is_available() and utils.device_type == "cuda":
        utils.device_type, utils.device_module = "cpu", _cpu_device_module(torch)

    # torchtitan/distributed/utils.py set_pg_timeouts: torch.distributed.set_timeout does not
    # exist in torch 2.13 (torchtitan is written against a newer torch), and its barrier passes
    # an accelerator's device_ids.
    from torchtitan.distributed import utils as dist_utils

    if not getattr(dist_utils.set_pg_timeouts, "_reshard_cpu", False):
        def set_pg_timeouts(timeout: Any, parallel_dims: Any) -> None:
            torch.distributed.barrier()

        set_pg_timeouts._reshard_cpu = True  # type: ignore[attr-defined]
        dist_utils.set_pg_timeouts = set_pg_timeouts

    # torchtitan/distributed/fsdp.py: set_gradient_divide_factor(1.0) makes FSDP2 reduce-scatter
    # with ReduceOp.PREMUL_SUM, which gloo lacks ("Cannot use ReduceOp.PREMUL_SUM with Gloo";
    # FSDP2 picks it without asking the backend). Summing is the same reduction with factor 1.
    from torchtitan.distributed import fsdp

    divide = fsdp.disable_fsdp_gradient_division
    if not getattr(divide, "_reshard_cpu", False):
        def disable_fsdp_gradient_division(model: Any) -> None:
            divide(model)
            if torch.distributed.get_backend() == "gloo":
                for module in model.modules():
                    if isinstance(module, fsdp.FSDPModule):
                        module.set_force_sum_reduction_for_comms(True)

        disable_fsdp_gradient_division._reshard_cpu = True  # type: ignore[attr-defined]
        fsdp.disable_fsdp_gradient_division = disable_fsdp_gradient_division


apply()
