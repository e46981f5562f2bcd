"""Fault kinds: one declaration each, the only place that says what a kind of fault is.

A ``FaultKind`` says how the targeted rank executes the fault at its point, what that does to
the generation (``Ending``), which ranks it hits by default, how Hypothesis draws one, what the
scenario must provide, and how the report labels it. Validation, the supervisor, the probe's
plan, the strategies and the reports all read this registry; none of them lists kinds.

The bundled kinds are declared in ``pytest_reshard.chaos`` (one module per kind, beside its
constructor). A user declares one the same way::

    from pytest_reshard import chaos
    from pytest_reshard.schedule.kinds import Ending, FaultKind, register

    def corrupt_checkpoint(run, fault):          # runs inside the targeted rank, at the point
        ...

    register(FaultKind("corrupt_checkpoint", execute=corrupt_checkpoint, ending=Ending.NONE))
    faults = [chaos.fault("corrupt_checkpoint", rank=1, at_step=10, phase="checkpoint")]

``execute`` must be a module-level function (or ``"module:function"``): the rank imports it by
name, or from its file when its module is not importable there (a ``conftest.py``).
"""
from __future__ import annotations

import enum
import importlib
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from pytest_reshard.contract import Cause

if TYPE_CHECKING:  # pragma: no cover
    from pytest_reshard.schedule import Fault

__all__ = ["Ending", "FaultKind", "DrawContext", "register", "unregister", "get", "registered", "ending_of",
           "executor_of"]


class Ending(enum.Enum):
    """What a fault does to the generation it fires in."""

    NONE = "none"        # the ranks go on (a straggler, memory pressure, a counter changing)
    DEATH = "death"      # the victim dies unplanned; peers fail, the next generation resumes
    HANG = "hang"        # the victim stops working; the supervisor detects it and kills it alone
    PLANNED = "planned"  # the ranks are told in advance: save and exit before a deadline

    @property
    def terminal(self) -> bool:
        """The targeted ranks do not go on with the generation."""
        return self is not Ending.NONE


@dataclass(frozen=True)
class DrawContext:
    """What a Hypothesis draw of one fault may use."""

    step: int
    phase: str
    world_size: int                 # in effect at ``step``
    world_sizes: Sequence[int]      # the sizes a reshard may go to
    notice_s: float                 # notice and grace periods (generous under load)


@dataclass(frozen=True)
class FaultKind:
    """One kind of fault.

    - ``execute(run, fault)``: runs inside each targeted rank at the fault point (``run`` is the
      probe's ``Run``, acted on through its executor interface: ``emit``, ``hold``,
      ``notify_reshard``, ``repeat_fault``, ``watch_files``, ``power_off``, ``exposed``;
      ``fault`` the plan entry: ``kind``, ``id``, ``step``, ``phase``, ``params``). What must
      come from outside (a deadline, SIGKILL after grace) the supervisor enforces from
      ``ending``.
    - ``ending``: an ``Ending``, or a function of the fault's params returning one (an ECC error
      kills only at the compute layer).
    - ``cause``: for ``Ending.PLANNED``, how the generation ends (``Cause.RESHARD``, ...).
    - ``deadline_param``: the param holding a planned fault's deadline in seconds (the
      supervisor kills ranks still alive after it); ``relocates``: the next generation moves
      ranks to other devices (a rebalance); ``replaces``: the next generation keeps the world
      and every rank's process but one, the fault's ``rank`` param, whose shard moves to a new
      process (a migration).
    - ``default_target``: ``"one"`` (a victim drawn from the seed) or ``"all"``.
    - ``draw(draw, ctx) -> Fault``: how Hypothesis draws one (``None``: never drawn);
      ``min_world_size``: drawn only at or above this size (a death needs a survivor).
    - ``requires(options) -> str | None``: the reason a scenario with these options (``launcher``,
      ``nodes``, ...) cannot run this kind, or None.
    - ``watches_files``: the ranks' file events are recorded (``Scenario.files``): the kind
      fires at one of them, and ``crash_consistency`` judges the files it left.
    - ``loses_unsynced``: the kind undoes what was not durable (a power loss): every rank of
      the generation keeps a hard link to each file a rename replaces, to bring it back.
    - ``isolates``: the victim's node lives on, cut off the network (a partition): once a
      rank of the generation fails, the supervisor fences that node (kills its agent and ranks,
      as a scheduler fences a node that stopped answering) and names the victim partitioned.
    - ``label``: how the report names it (default: ``name``).
    """

    name: str
    execute: Callable[[Any, Mapping[str, Any]], None] | str
    ending: Ending | Callable[[Mapping[str, Any]], Ending] = Ending.NONE
    cause: Cause | None = None
    deadline_param: str | None = None
    relocates: bool = False
    replaces: bool = False
    default_target: str = "one"
    draw: Callable[[Any, DrawContext], "Fault"] | None = None
    min_world_size: int = 1
    requires: Callable[[Mapping[str, Any]], str | None] | None = None
    watches_files: bool = False
    loses_unsynced: bool = False
    isolates: bool = False
    label: str = ""
    doc: str = ""

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").isalnum():
            raise ValueError(f"fault kind name {self.name!r}: use letters, digits and '_'")
        if self.default_target not in ("one", "all"):
            raise ValueError(f"{self.name}: default_target must be 'one' or 'all'")
        if self.ending is Ending.PLANNED and (self.cause is None or self.deadline_param is None):
            raise ValueError(f"{self.name}: a planned kind needs cause= and deadline_param=")
        if not isinstance(self.execute, str) and (
                not callable(self.execute) or "<locals>" in getattr(self.execute, "__qualname__", "<locals>")):
            raise ValueError(f"{self.name}: execute must be a module-level function or "
                             "'module:function' (the rank imports it by name)")

    def ending_of(self, params: Mapping[str, Any]) -> Ending:
        return self.ending(params) if callable(self.ending) else self.ending


_KINDS: dict[str, FaultKind] = {}


def register(kind: FaultKind, *, replace: bool = False) -> FaultKind:
    """Make ``kind`` known to validation, the supervisor, the strategies and the reports. The
    same declaration run again (a conftest imported twice: the same executor) replaces itself."""
    old = _KINDS.get(kind.name)
    if old is not None and not replace and executor_of(old) != executor_of(kind):
        raise ValueError(f"fault kind {kind.name!r} is already registered; pass replace=True "
                         "to redefine it")
    _KINDS[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    """Forget the kind ``name`` (a test's own, say)."""
    _KINDS.pop(name, None)


#: The modules that declare the bundled kinds, loaded on the first lookup like any plugin: the
#: registry sits below them (they import it to register), so it names them instead of importing.
BUNDLED = ("pytest_reshard.chaos",)


def _load_bundled() -> None:
    for module in BUNDLED:
        importlib.import_module(module)


def get(name: str) -> FaultKind:
    """The kind named ``name``; an error listing the known ones otherwise."""
    if name not in _KINDS:
        _load_bundled()
    try:
        return _KINDS[name]
    except KeyError:
        raise KeyError(f"unknown fault kind {name!r}: known kinds are {', '.join(registered())}; "
                       "declare your own with pytest_reshard.schedule.kinds.register") from None


def registered() -> list[str]:
    _load_bundled()
    return sorted(_KINDS)


def ending_of(name: str, params: Mapping[str, Any]) -> Ending:
    return get(name).ending_of(params)


def executor_of(kind: FaultKind) -> dict[str, str]:
    """How the plan names the executor for the rank: ``{"execute": "module:function"}`` and,
    when the module may not be importable in the rank (``__main__``, a conftest), its file."""
    if isinstance(kind.execute, str):
        return {"execute": kind.execute}
    fn = kind.execute
    out = {"execute": f"{fn.__module__}:{fn.__qualname__}"}
    try:
        out["execute_file"] = inspect.getfile(fn)
    except TypeError:
        pass
    return out
