"""What a registered checker is given: the run's history and scenario, and lazy clean runs.

The session builds one ``CheckContext`` per scenario and hands it to every registered checker
(``checkers.registry``). A clean reference run costs a whole run, so the context never starts one
itself: ``ctx.reference(roles)`` asks the session, which runs it once per configuration and
topology and caches it; a checker that needs none costs nothing.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence

from pytest_reshard.history import History

if TYPE_CHECKING:  # the supervisor is not imported to read a history
    from pytest_reshard.supervisor import Scenario

__all__ = ["CheckContext", "CleanReference", "CleanRuns", "ReferenceRuns", "noise_floor_roles"]

#: ``reference(roles) -> History``: a fault-free run of the same workload, seed and data with one
#: rank per entry of ``roles`` (the session's ``Session.reference``, cached there).
ReferenceRuns = Callable[[Sequence[str]], History]


class CleanRuns(NamedTuple):
    """The clean runs that loss continuity and lost samples are judged against."""

    reference: History | None   # at the scenario's first topology; None: no reference available
    second: History | None      # at another topology, to measure the noise floor; None: none
    broken: str | None          # why neither can be used: a clean run did not finish (else None)


class CleanReference(NamedTuple):
    """One clean run at one topology (``CheckContext.clean_reference``)."""

    history: History | None     # None: this context has no source of clean runs
    broken: str | None          # why it cannot be used: it did not finish, or the run never started


@dataclass(frozen=True)
class CheckContext:
    """Everything a checker may read about one run.

    ``history``: what the run recorded. ``scenario``: what it was asked to do (None when a
    history is checked on its own). ``reference``: the session's clean-run source (None: no clean
    runs can be had, and the checkers that need one say ``unknown``). ``opted_in``: names of
    checkers the workload asks for; an opted-in checker runs even where its own rule would
    not apply it.
    """

    history: History
    scenario: "Scenario | None" = None
    reference_runs: ReferenceRuns | None = None
    opted_in: frozenset[str] = frozenset()
    _cache: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def reference(self, roles: Sequence[str]) -> History:
        """The clean run with these ranks' roles (started by the session on first use, then
        cached). Raises ``LookupError`` when this context has no source of clean runs."""
        runs = self.reference_runs
        if runs is None:
            raise LookupError("this check context has no clean reference runs (it was built "
                              "without reference_runs=); run the scenario through a Session")
        # asked once per topology, by every checker together
        return self._once(("reference", tuple(roles)), lambda: runs(list(roles)))

    def _once(self, key: Any, compute: Callable[[], Any]) -> Any:
        """``compute()``'s value, computed once per context; an exception is kept and raised
        again, so a clean run that cannot start is not started twice."""
        if key not in self._cache:
            try:
                self._cache[key] = compute()
            except Exception as e:  # noqa: BLE001 - raised again below, every time
                self._cache[key] = e
        got = self._cache[key]
        if isinstance(got, Exception):
            raise got
        return got

    @property
    def has_references(self) -> bool:
        return self.reference_runs is not None

    @property
    def first_roles(self) -> list[str]:
        """Each rank's role in the first generation as the scenario asked for it (or as the
        history recorded it, without a scenario)."""
        if self.scenario is not None:
            return self.scenario.initial_roles()
        gens = self.history.generations
        return list(gens[min(gens)].roles) if gens else []

    def has_roles(self, *roles: str) -> bool:
        """Some generation of the run has a rank of each of ``roles``."""
        return any(set(roles) <= set(g.roles) for g in self.history.generations.values())

    def clean_reference(self, roles: Sequence[str]) -> CleanReference:
        """The clean run with these ranks' roles and whether it can be compared with (cached per
        topology). Asks for that one run only: a checker that judges each generation against
        the clean run at its own topology pays for the topologies the run used, no more. A run
        in which no rank began a step starts none (there is nothing to compare)."""
        clean = self._once(("clean_at", tuple(roles)), lambda: self._clean_reference(list(roles)))
        assert isinstance(clean, CleanReference)
        return clean

    def _clean_reference(self, roles: list[str]) -> CleanReference:
        if self.history.never_started() is not None:
            said = self.clean_runs().broken  # the same words as the other checkers' reason
            return CleanReference(None, said)
        if self.reference_runs is None:
            return CleanReference(None, None)
        h = self.reference(roles)
        return CleanReference(h, _unfinished(h, len(roles)))

    def clean_runs(self) -> CleanRuns:
        """The clean run at the first topology, one at a second topology for the noise floor
        (``noise_floor_roles``), and whether either failed to finish (computed once).

        A run in which no rank began a step shows the workload cannot start: no clean run is
        started (it would only wait out the same timeout twice more), and ``broken`` says
        "the run never started" for the checkers that compare with one."""
        clean = self._once("clean", self._clean_runs)
        assert isinstance(clean, CleanRuns)
        return clean

    def _clean_runs(self) -> CleanRuns:
        never = self.history.never_started()
        if never is not None:
            return CleanRuns(None, None, f"{never}; no clean reference run was started")
        if self.reference_runs is None:
            return CleanRuns(None, None, None)
        first = self.first_roles
        reference = self.reference(first)
        other = noise_floor_roles(first, self.history)
        second = self.reference(other) if other is not None else None
        for h in (reference, second):
            if h is None:
                continue
            broken = _unfinished(h, "?")
            if broken is not None:  # without a clean run there is nothing to compare against
                return CleanRuns(reference, second, broken)
        return CleanRuns(reference, second, None)

    def clean_first(self) -> tuple[History | None, str | None]:
        """The clean run at the run's first topology, and why it cannot be compared with (None:
        it can). Starts no clean run for a run that never began a step, and no other topology:
        the sample and liveness checks need this one only (what ``clean_runs()`` found already is
        reused)."""
        never = self.history.never_started()
        if never is not None:
            return None, f"{never}; no clean reference run was started"
        done = self._cache.get("clean")
        if isinstance(done, Exception):   # a clean run that cannot start is not started twice
            raise done
        if done is not None:
            return done.reference, done.broken
        got = self._once("clean_first", self._first_clean_run)
        assert isinstance(got, tuple)
        return got

    def _first_clean_run(self) -> tuple[History | None, str | None]:
        if not self.has_references:
            return None, None
        h = self.reference(self.first_roles)
        return h, _unfinished(h, len(self.first_roles))


def _unfinished(clean: History, size: Any) -> str | None:
    """Why a clean reference run cannot be compared with: it did not pass liveness (``size``:
    its world size in words when it has no scenario record). The one place that decides it."""
    from pytest_reshard.checkers.liveness import clean_problem  # liveness registers on import

    if clean.damaged:
        d = clean.damaged[0]
        return (f"the clean reference run's history is damaged at {d.file}:{d.line} ({d.why}), so "
                "it cannot be compared with")
    problem = clean_problem(clean)
    if problem is None:
        return None
    world = clean.scenario.world_size if clean.scenario else size
    return f"the clean reference run (world size {world}) did not finish: {problem} (see liveness)"


def noise_floor_roles(first: list[str], history: History) -> list[str] | None:
    """A second topology whose clean run sets the noise floor: one the run used, else half the
    ranks (one role), else one rank moved from the biggest role to the smallest (None when no
    such topology keeps every role)."""
    used = [list(g.roles) for _, g in sorted(history.generations.items())
            if g.roles and list(g.roles) != first]
    if used:
        return used[0]
    if len(set(first)) == 1:
        half = len(first) // 2
        return first[:half] if half else None
    # Several roles: move one rank from the biggest role to the smallest (2+2 -> 1+3), which
    # changes how the work splits as a reshard would, and keeps every role.
    counts = Counter(first)
    big = max(counts, key=lambda r: counts[r])
    small = min((r for r in counts if r != big), key=lambda r: counts[r])
    if counts[big] < 2:
        return None
    out = list(first)
    out[max(i for i, r in enumerate(out) if r == big)] = small
    return sorted(out, key=list(counts).index)
