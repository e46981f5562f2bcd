"""``scenario_from``: a Scenario from plain arguments, with every mistake rejected before a
process starts, in words that say what to change."""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from pytest_reshard import workloads
from pytest_reshard.schedule import Fault, Schedule, kinds, validate
from pytest_reshard.supervisor import launch
from pytest_reshard.supervisor.policies.membership import check_scenario as check_membership
from pytest_reshard.contract import OWN_GPUS
from pytest_reshard.supervisor.devices import MODES as THROTTLES, expand_devices, gpu_classes
from pytest_reshard.supervisor.scenario import Scenario, expand_roles

__all__ = ["scenario_from"]


def _check_nodes(world_size: int, options: dict[str, Any]) -> None:
    """Multi-node settings that cannot work, rejected before any agent starts."""
    nodes = int(options.get("nodes", 1))
    multi_node = bool(options.get("launcher")) and launch.facts(options["launcher"])["multi_node"]
    if multi_node and (nodes < 1 or world_size % nodes):
        raise ValueError(f"launcher={options['launcher']!r}: world_size {world_size} must split "
                         f"evenly into nodes={nodes} (each node runs world_size / nodes ranks)")


#: Scenario fields given by scenario_from's own arguments, not as options
NOT_OPTIONS = ("workload", "world_size", "steps", "schedule")


def scenario_from(workload: str, *, world_size: int, steps: int, faults: Sequence[Fault] = (),
                  seed: int = 0, **options: Any) -> Scenario:
    """Build a Scenario, rejecting bad input with messages that say what to change."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    unknown = sorted(set(options) - {f.name for f in dataclasses.fields(Scenario)})
    if unknown:
        known = [f.name for f in dataclasses.fields(Scenario) if f.name not in NOT_OPTIONS]
        raise ValueError(f"no scenario option {', '.join(map(repr, unknown))}: the options are "
                         f"{', '.join(known)}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    flat: list[Fault] = []
    for f in faults:  # injectors such as chaos.drain return several faults
        for one in (f if isinstance(f, (list, tuple)) else [f]):
            if not isinstance(one, Fault):
                raise TypeError(f"faults must be built with pytest_reshard.chaos, got {one!r}")
            flat.append(one)
    schedule = Schedule(seed, flat)
    # A kind that fires at a file event needs them recorded, in the clean reference run too.
    options["files"] = bool(options.get("files")) or any(kinds.get(f.kind).watches_files
                                                         for f in flat)
    if options.get("roles") is not None:
        options["roles"] = expand_roles(options["roles"], world_size)
    if options.get("devices") == OWN_GPUS:
        if options.get("backend") != "nccl":
            raise ValueError("devices='gpu' reads each rank's class from the GPU it computes on, "
                             f"but the backend is {options.get('backend', 'gloo')!r}: the ranks "
                             "compute on CPU; run with --reshard-backend=nccl (or backend='nccl')")
        if options.get("throttle", "auto") not in ("auto", OWN_GPUS):
            raise ValueError(f"throttle={options['throttle']!r} slows ranks on CPU; devices='gpu' "
                             "runs each rank at its own GPU's speed: leave throttle= out")
        options["devices"], _ = gpu_classes(world_size)
        options["throttle"] = OWN_GPUS
    elif options.get("devices") is not None:
        options["devices"] = expand_devices(options["devices"], world_size)
        if options.get("throttle") == OWN_GPUS:
            raise ValueError("throttle='gpu' reads the classes from the ranks' GPUs: pass "
                             "devices='gpu' instead of naming them")
    if options.get("throttle", "auto") not in THROTTLES:
        raise ValueError(f"throttle={options['throttle']!r}: use one of {', '.join(THROTTLES)}")
    spec = workloads.get(workload)
    if not options.get("phases") and spec is not None and spec.phases:
        options["phases"] = list(spec.phases)
    if options.get("launcher"):
        launch.launcher_class(options["launcher"])  # an unknown one: the error lists them
    _check_nodes(world_size, options)
    facts = launch.facts(options["launcher"]) if options.get("launcher") else {}
    validate(schedule, world_size=world_size, steps=steps, phases=options.get("phases") or (),
             options={**facts, **options})  # a kind's requires() reads the launcher's facts
    scenario = Scenario(workload=workload, world_size=world_size, steps=steps, schedule=schedule,
                        **options)
    check_membership(scenario)
    return scenario


def resolve_backend(backend: str) -> str:
    """``auto`` -> nccl where CUDA is available, else gloo; an explicit ``nccl`` without CUDA is
    an error (ValueError), not a silent fall back to gloo."""
    if backend == "gloo":
        return backend
    import torch

    has_cuda = torch.cuda.is_available()
    if backend == "nccl" and not has_cuda:
        raise ValueError("backend='nccl' was asked for, but no CUDA device is available here; "
                         "use backend='auto' to fall back to gloo on CPU, or mark the test "
                         "@pytest.mark.gpu so that it is skipped without one")
    return "nccl" if has_cuda else "gloo"
