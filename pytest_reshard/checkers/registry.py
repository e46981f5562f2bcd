"""The one registry of checkers: what ``Session.check`` runs, what ``Result.assert_*`` asserts,
and what the verdict tables show as columns.

A checker is registered once, with the rule that says when it applies to a run::

    from pytest_reshard import checkers
    from pytest_reshard.verdict import Verdict

    @checkers.register("eval_metric", column="eval", applies=lambda ctx: True,
                       when="always", description="the last step's loss is below 2.0")
    def eval_metric(ctx: checkers.CheckContext) -> Verdict:
        ...

It then runs on every scenario it applies to (or that opts into it), shows as the ``eval``
column of the verdict table, in ``verdict.json`` and ``report.html``, and is asserted with
``result.assert_eval_metric()`` (and by ``result.assert_ok()``). A checker that raises becomes an
``unknown`` verdict naming it and the exception; one that does not apply is absent.
"""
from __future__ import annotations

import dataclasses
import inspect
import keyword
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence, TypeVar

from pytest_reshard.contract import Damaged
from pytest_reshard.history.loading import without_gc
from pytest_reshard.verdict import Verdict

if TYPE_CHECKING:  # the context is only an annotation here: it imports the checkers it runs
    from pytest_reshard.checkers.context import CheckContext

__all__ = ["Checker", "CheckFn", "RegistrationError", "register", "add", "unregister",
           "registered", "get", "by_assertion", "run_all", "columns", "RESERVED_ASSERTIONS"]

CheckFn = Callable[["CheckContext"], Verdict]
F = TypeVar("F", bound=CheckFn)

#: ``Result`` methods a checker's assertion may not take.
RESERVED_ASSERTIONS = frozenset({"assert_ok"})


def _always(ctx: CheckContext) -> bool:
    return True


@dataclass(frozen=True)
class Checker:
    """One registered checker.

    ``name``: the verdict's key (``verdict.json``, ``result.verdicts``). ``fn(ctx) -> Verdict``:
    the check. ``applies(ctx) -> bool``: whether it runs on this scenario; ``when``: the same
    rule in words, for the message of an assertion on a run it did not apply to. ``column``: its
    verdict-table header. ``assertion``: its ``Result`` method (``assert_<name>`` by default).
    ``description``: one line, what it checks.
    """

    name: str
    fn: CheckFn
    applies: Callable[[CheckContext], bool] = _always
    when: str = "always"
    column: str = ""
    assertion: str = ""
    description: str = ""
    origin: str = ""   # where it was registered (module:line), for the duplicate error

    def __post_init__(self) -> None:
        if not (isinstance(self.name, str) and self.name.isidentifier()
                and not keyword.iskeyword(self.name)):
            raise RegistrationError(f"checker name {self.name!r}: use a Python identifier "
                                    "(letters, digits, _), since it names assert_<name>")
        if not callable(self.fn) or not callable(self.applies):
            raise RegistrationError(f"checker {self.name!r}: fn and applies must be callables "
                                    "taking a CheckContext")
        object.__setattr__(self, "column", self.column or self.name)
        object.__setattr__(self, "assertion", self.assertion or f"assert_{self.name}")
        if not self.description:
            doc = inspect.getdoc(self.fn) or ""
            object.__setattr__(self, "description", doc.strip().split("\n\n")[0].replace("\n", " "))
        if not (self.assertion.startswith("assert_") and self.assertion.isidentifier()):
            raise RegistrationError(f"checker {self.name!r}: assertion {self.assertion!r} must "
                                    "be an identifier starting with assert_")
        if self.assertion in RESERVED_ASSERTIONS:
            raise RegistrationError(f"checker {self.name!r}: {self.assertion} is Result's own "
                                    "method; choose another assertion= name")

    def run(self, ctx: CheckContext) -> Verdict | None:
        """This checker's verdict on ``ctx``, or None when it does not apply (and is not opted
        into). Never raises (Exception): a checker that raises, or returns something else than a
        Verdict, is an ``unknown`` verdict naming the checker and what went wrong. The verdict is
        filed under this checker's name whatever ``check`` the function gave it."""
        try:
            applies = self.name in ctx.opted_in or self.applies(ctx)
        except Exception as e:  # noqa: BLE001 - reported as the verdict
            return self._stamp(ctx, self._broken("deciding whether it applies raised", e))
        if not applies:
            return None
        if ctx.history.damaged:
            return self._stamp(ctx, _not_judged(self.name, ctx.history.damaged))
        try:
            v = self.fn(ctx)
        except Exception as e:  # noqa: BLE001 - reported as the verdict
            v = self._broken("raised", e)
        if not isinstance(v, Verdict):
            v = Verdict.unknown(self.name, f"checker {self.name!r} returned {v!r}, not a "
                                "Verdict; return Verdict.passed/failed/unknown(...)")
        return self._stamp(ctx, v)

    def _stamp(self, ctx: CheckContext, v: Verdict) -> Verdict:
        """``v`` filed under this checker's name, with the command that replays the run: the
        one place a verdict gets it (a checker's own replay, if it set one, stays)."""
        return dataclasses.replace(v, check=self.name, replay=v.replay or ctx.history.replay)

    def _broken(self, what: str, e: Exception) -> Verdict:
        frames = traceback.extract_tb(e.__traceback__)
        at = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
        return Verdict.unknown(
            self.name, f"checker {self.name!r} {what} {type(e).__name__}: {e}{at}; this is a bug "
            "in the checker or a history it did not expect, so it could not decide",
            details={"exception": type(e).__name__, "error": str(e),
                     "traceback": "".join(traceback.format_exception(type(e), e,
                                                                     e.__traceback__))})


def _not_judged(name: str, damaged: Sequence[Damaged]) -> Verdict:
    first = damaged[0]
    more = f" (and {len(damaged) - 1} more line{'s' * (len(damaged) > 2)})" if len(damaged) > 1 else ""
    return Verdict.unknown(
        name, f"not judged: the run's history is damaged at {first.file}:{first.line}: "
        f"{first.why}{more}" + ("; an event file changed after the harness wrote it (a full or "
                                "failing disk, another process writing into the run folder); "
                                "rerun on a healthy file system" if first.written else ""),
        details={"damaged": [dataclasses.asdict(d) for d in damaged]})


class RegistrationError(ValueError):
    """A checker cannot be registered as asked (a duplicate name or assertion, a bad name)."""


_REGISTRY: dict[str, Checker] = {}


def add(checker: Checker, *, replace: bool = False) -> Checker:
    """Register ``checker``. Refuses a name (or assertion) already registered unless
    ``replace=True``, which replaces the checker of that name in place (same table position).
    The same registration run again (a conftest imported twice: same ``origin``) replaces
    itself."""
    old = _REGISTRY.get(checker.name)
    if old is not None and not replace and not (old.origin and old.origin == checker.origin):
        raise RegistrationError(
            f"a checker named {checker.name!r} is already registered"
            f"{f' (at {old.origin})' if old.origin else ''}; choose another name, or pass "
            "replace=True to replace it")
    clash = next((c for c in _REGISTRY.values()
                  if c.assertion == checker.assertion and c.name != checker.name), None)
    if clash is not None:
        raise RegistrationError(f"checker {checker.name!r}: {checker.assertion} already asserts "
                                f"the checker {clash.name!r}; pass another assertion=")
    _REGISTRY[checker.name] = checker
    return checker


def register(name: str, *, applies: Callable[[CheckContext], bool] | None = None,
             when: str | None = None, column: str | None = None, assertion: str | None = None,
             description: str | None = None, replace: bool = False) -> Callable[[F], F]:
    """Decorator: register ``fn(ctx: CheckContext) -> Verdict`` as the checker ``name``.

    ``applies``: when it runs (default: on every scenario); ``when``: that rule in words
    (default ``"always"``, or ``"its applies= rule holds"`` with a rule); ``column``: its
    verdict-table header (default: the name); ``assertion``: its ``Result`` method (default
    ``assert_<name>``); ``description``: one line (default: the docstring's first paragraph).
    A name already registered is refused unless ``replace=True``. Returns ``fn`` unchanged.
    """
    frame = inspect.currentframe()
    caller = frame.f_back if frame is not None else None
    origin = f"{caller.f_code.co_filename}:{caller.f_lineno}" if caller is not None else ""

    def decorate(fn: F) -> F:
        add(Checker(name, fn, applies or _always, when or _words(applies), column or "",
                    assertion or "", description or "", origin=origin), replace=replace)
        return fn

    return decorate


def _words(applies: Callable[[CheckContext], bool] | None) -> str:
    """A rule in words, when the registration gave none: its docstring, else its name."""
    if applies is None:
        return "always"
    doc = inspect.getdoc(applies)
    if doc:
        return doc.strip().split("\n\n")[0].replace("\n", " ").rstrip(".")
    name = getattr(applies, "__qualname__", "")
    return f"{name}(ctx) is true" if name and "<lambda>" not in name else \
        "its applies= rule is true (registered without when=)"


def unregister(name: str) -> Checker:
    """Remove the checker ``name`` and return it (``add(it)`` puts it back at the end)."""
    try:
        return _REGISTRY.pop(name)
    except KeyError:
        raise LookupError(f"no checker named {name!r} is registered; registered: "
                          f"{', '.join(_REGISTRY)}") from None


def registered() -> tuple[Checker, ...]:
    """Every registered checker, in registration order (the built-ins first)."""
    return tuple(_REGISTRY.values())


def get(name: str) -> Checker | None:
    return _REGISTRY.get(name)


def by_assertion(method: str) -> Checker | None:
    """The checker whose ``Result`` method is ``method`` (``"assert_live"`` -> liveness)."""
    return next((c for c in _REGISTRY.values() if c.assertion == method), None)


def run_all(ctx: CheckContext, checkers: Iterable[Checker] | None = None) -> dict[str, Verdict]:
    """Each checker's verdict on ``ctx``, by name, in registration order; a checker that does
    not apply (and is not opted into) is absent, one that raises is ``unknown``."""
    out: dict[str, Verdict] = {}
    with without_gc():
        for c in (registered() if checkers is None else checkers):
            v = c.run(ctx)
            if v is not None:
                out[c.name] = v
    return out


def columns(checks: Iterable[str] | None = None,
            headers: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """``(check, header)`` of each verdict-table column.

    Without ``checks``: every registered checker. With them (the checks some rows ran): the
    registered ones among them in registration order, then the others in the order given,
    headed by ``headers[check]`` (what a row carries from the process that ran it) or the name.
    """
    if checks is None:
        return [(c.name, c.column) for c in _REGISTRY.values()]
    ran = list(dict.fromkeys(checks))
    known = [(c.name, c.column) for c in _REGISTRY.values() if c.name in ran]
    return known + [(n, (headers or {}).get(n) or n) for n in ran if n not in _REGISTRY]
