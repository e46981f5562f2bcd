"""The supervisor's incremental reader of the ranks' event files, while they are written."""
from __future__ import annotations

from pathlib import Path

from pytest_reshard.contract import Ev, RunDir, decode_event, name_of

__all__ = ["EventTail"]


class EventTail:
    """Incrementally reads the JSONL files of the run, keeping the parsed events by file."""

    def __init__(self, run_dir: RunDir) -> None:
        self.dir = run_dir.events
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}
        self.by_rank: dict[tuple[int, int], list[dict]] = {}
        self._unseen: list[dict] = []

    def take(self) -> list[dict]:
        """Events read since the last ``take`` (whoever triggered the read)."""
        new, self._unseen = self._unseen, []
        return new

    def poll(self, gen: int) -> None:
        """Read what the ranks of ``gen`` appended since the last poll."""
        for path in sorted(self.dir.glob(f"g{gen}-r*.jsonl")):
            with open(path, "rb") as f:
                f.seek(self._offsets.get(path, 0))
                chunk = f.read()
            if not chunk:
                continue
            self._offsets[path] = self._offsets.get(path, 0) + len(chunk)
            data = self._partial.pop(path, b"") + chunk
            *lines, rest = data.split(b"\n")
            if rest:
                self._partial[path] = rest
            for line in lines:
                try:
                    ev = decode_event(line)
                except ValueError:
                    continue   # damaged: the history names it, and nothing is judged
                if not ("ev" in ev and isinstance(ev.get("gen"), int) and isinstance(ev.get("rank"), int)):
                    continue   # the same
                self.by_rank.setdefault((ev["gen"], ev["rank"]), []).append(ev)
                self._unseen.append(ev)

    def events(self, gen: int, rank: int) -> list[dict]:
        return self.by_rank.get((gen, rank), [])

    def pids(self, gen: int) -> dict[int, int]:
        self.poll(gen)
        return {r: evs[0]["pid"] for (g, r), evs in self.by_rank.items()
                if g == gen and evs and name_of(evs[0]) == Ev.START}

    def clean_exit(self, gen: int, rank: int) -> bool:
        self.poll(gen)
        return self.closed(gen, rank)

    def closed(self, gen: int, rank: int) -> bool:
        """The rank's last event read so far is its exit (its interpreter is ending)."""
        evs = self.events(gen, rank)
        return bool(evs) and name_of(evs[-1]) == Ev.EXIT

    def last_position(self, gen: int, rank: int) -> tuple[int | None, str | None]:
        """(step, phase) where the rank was last seen."""
        for ev in reversed(self.events(gen, rank)):
            if name_of(ev) == Ev.POINT:
                return ev["step"], ev["phase"]
            name = name_of(ev)
            if name in (Ev.BEGIN, Ev.END):
                return ev["step"], "begin" if name == Ev.BEGIN else "end"
            if name in (Ev.ERROR, Ev.FAULT):
                return ev["step"], ev.get("phase")
        return None, "startup"


