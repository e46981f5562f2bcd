"""Membership-mode queries (``Scenario.replica_groups``): incarnations, attempts, commits by a
replica group, replays and split quorums. Mixed into ``History``."""
from __future__ import annotations

from typing import Any

from pytest_reshard.contract import Ev, MemberAction
from pytest_reshard.history.records import Attempt, Event, Replay

__all__ = ["MembershipQueries"]


class MembershipQueries:
    """The membership half of ``History``: it reads ``_ranked``, ``replica_groups`` and
    ``supervisor_events`` of the history it is mixed into."""

    replica_groups: tuple[int, int] | None
    _attempts: list[Attempt] | None
    _by_step: dict[tuple[int, int], list[Attempt]] | None
    generations: dict[int, Any]

    @property
    def _ranked(self) -> list[tuple[int, Event]]:
        raise NotImplementedError

    def supervisor_events(self, ev: str | None = None, *, gen: int | None = None) -> list[Event]:
        raise NotImplementedError

    def committed(self, gen: int) -> frozenset[int]:
        raise NotImplementedError

    def group_of(self, rank: int) -> int:
        """The replica group of ``rank`` (membership mode)."""
        assert self.replica_groups is not None, "not a membership run"
        return rank // self.replica_groups[1]

    def member_restarts(self, gen: int | None = None) -> list[Event]:
        """The supervisor's restarts of one replica group (``member`` events, action restart)."""
        return [e for e in self.supervisor_events(Ev.MEMBER, gen=gen)
                if e.get("action") == MemberAction.RESTART]

    def attempts(self, gen: int | None = None, *, rank: int | None = None) -> list[Attempt]:
        """Every ``begin`` of every rank (of ``gen``, of ``rank``), in history order."""
        if self._attempts is None:
            self._attempts = self._build_attempts()
        return [a for a in self._attempts if (gen is None or a.gen == gen)
                and (rank is None or a.rank == rank)]

    def _attempts_of(self, gen: int, step: int) -> list[Attempt]:
        if self._by_step is None:
            self._by_step = {}
            for a in self.attempts():
                self._by_step.setdefault((a.gen, a.step), []).append(a)
        return self._by_step.get((gen, step), [])

    def _build_attempts(self) -> list[Attempt]:
        incarnation: dict[tuple[int, int], int] = {}
        started: dict[tuple[int, int], int] = {}
        open_: dict[tuple[int, int], dict[str, Any]] = {}
        done: list[dict[str, Any]] = []
        for i, e in self._ranked:
            key, ev = (int(e["gen"]), int(e["rank"])), e["ev"]
            if ev == Ev.START:
                incarnation[key] = incarnation.get(key, -1) + 1
                started[key] = i
                if key in open_:
                    done.append(open_.pop(key))   # the last incarnation died in it
            elif ev == Ev.BEGIN:
                if key in open_:
                    done.append(open_.pop(key))
                open_[key] = {"gen": key[0], "rank": key[1], "incarnation": incarnation.get(key, 0),
                              "step": int(e["step"]), "begin_index": i, "end_index": None,
                              "start_index": started.get(key, -1),
                              "samples": [], "quorum": None, "participants": None,
                              "participating": None, "phase": "begin"}
            elif key in open_ and e.get("step") == open_[key]["step"]:
                a = open_[key]
                if ev == Ev.RECORD:
                    epoch = int(e.get("epoch", 0) or 0)
                    a["samples"].extend((epoch, int(x)) for x in e.get("samples") or ())
                    if "quorum" in e:
                        a["quorum"] = e["quorum"]
                    if e.get("participants") is not None:
                        a["participants"] = int(e["participants"])
                    if e.get("participating") is not None:
                        a["participating"] = bool(e["participating"])
                elif ev == Ev.POINT:
                    a["phase"] = str(e.get("phase"))
                elif ev == Ev.END:
                    a["end_index"] = i
                    done.append(open_.pop(key))
                elif ev == Ev.ERROR:
                    done.append(open_.pop(key))
        done.extend(open_.values())
        return sorted((Attempt(**{**a, "samples": tuple(a["samples"])}) for a in done),
                      key=lambda a: a.begin_index)

    def _first_commits(self, gen: int) -> dict[int, int]:
        """step -> when (event index) it was first committed in membership generation ``gen``:
        the earliest moment every rank of one incarnation of some replica group (its ranks are
        restarted together) had ended an attempt of it."""
        assert self.replica_groups is not None
        groups, per = self.replica_groups
        # (step, group, incarnation) -> rank -> its first end
        ends: dict[tuple[int, int, int], dict[int, int]] = {}
        for a in self.attempts(gen):
            if a.end_index is not None:
                ends.setdefault((a.step, a.rank // per, a.incarnation), {}).setdefault(
                    a.rank, a.end_index)
        out: dict[int, int] = {}
        for (step, _, _), by_rank in ends.items():
            if len(by_rank) == per:
                at = max(by_rank.values())
                out[step] = min(out.get(step, at), at)
        return out

    def replays(self, gen: int) -> list[Replay]:
        """A committed step the quorum executed again (membership mode; empty outside it): an
        attempt that ended a step committed before its incarnation started (a restarted group
        that trained from older state than the quorum's), or a second end of a step by the same
        incarnation."""
        if self.replica_groups is None:
            return []
        first = self._first_commits(gen)
        out, ended = [], set()
        for a in self.attempts(gen):
            if not a.ended:
                continue
            key = (a.rank, a.incarnation, a.step)
            if key in ended or (a.step in first and first[a.step] < a.start_index):
                out.append(Replay(a.gen, a.rank, a.incarnation, a.step, first.get(a.step, -1)))
            ended.add(key)
        return out

    def split_commits(self, gen: int) -> dict[int, dict[str, set[int]]]:
        """Steps that replica groups committed in different quorums (a split brain: each side
        went on with its own state): step -> quorum (as recorded) -> the groups; membership
        mode only, and only where the workload recorded its quorum (``quorum=``)."""
        if self.replica_groups is None:
            return {}
        per = self.replica_groups[1]
        by: dict[int, dict[str, set[int]]] = {}
        for a in self.attempts(gen):
            if a.ended and a.quorum is not None:
                by.setdefault(a.step, {}).setdefault(str(a.quorum), set()).add(a.rank // per)
        return {step: quorums for step, quorums in sorted(by.items()) if len(quorums) > 1}

    def reduced_steps(self, gen: int | None = None) -> frozenset[int]:
        """Committed steps (of ``gen``, else of any generation) some group ended in a quorum of
        fewer than all replica groups (``participants=`` recorded below the group count): a
        clean run never trains those."""
        if self.replica_groups is None:
            return frozenset()
        if gen is None:
            return frozenset().union(*(self.reduced_steps(g) for g in self.generations))
        groups = self.replica_groups[0]
        committed = self.committed(gen)
        return frozenset(a.step for a in self.attempts(gen) if a.ended and a.step in committed
                         and a.participants is not None and a.participants < groups)

