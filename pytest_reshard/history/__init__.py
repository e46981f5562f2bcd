"""The history: every event of every rank and generation, merged and queryable.

The probe writes one JSONL file per rank per generation (``events/g{gen}-r{rank}.jsonl``) and the
supervisor writes ``events/supervisor.jsonl``. ``History`` reads them once and answers the
questions the checkers ask ("which steps committed?", "whose effect persisted?", "which samples
did the kept steps consume?"). It is pure data: no processes, no torch, no pytest.

``History`` is the only reader of raw events: checkers, the sweep and the reports get records
(``history.records``) with the contract's enums. ``loading`` reads a run folder, ``queries``
holds ``History``, ``membership`` its membership-mode half.

Why the definitions are what they are:

- A step is *committed* in a generation when every rank of that generation's world size recorded
  its ``end``: a step some rank never finished may not have reached the state any rank saved.
- A generation's *resume step* is the step its ranks declared with ``run.resumed``; ranks should
  agree, and when they do not the lowest wins (the most state any of them threw away). A generation
  that never declared one but ran steps resumes, in effect, at the first step it began.
- In **membership mode** (``Scenario.replica_groups``; the supervisor's ``member`` events) a
  rank's file holds one *incarnation* per ``start`` event: a replica group restarted alone
  appends to it. Each ``begin`` is an *attempt* (a fault-tolerant trainer retries a step the
  quorum did not commit), and an attempt counts only if it ended. A step is committed when every
  rank of at least one replica group ended an attempt of it (torchft's commit is a vote inside a
  group: a group that ended the step holds its effect, and donates it to the groups that heal),
  and an occurrence's samples are those of its ended attempts.
- An occurrence ``(gen, step)`` is *kept* (its effect persisted into the final state) when the step
  ended on at least one rank in ``gen`` and every later generation that resumed did so after it
  (``step < resume step`` of all of them). When no later generation resumed, the run ended with
  ``gen``'s state, and only its committed steps count: an uncommitted step's effect is unknown.
"""
from __future__ import annotations

from pytest_reshard.contract import Torn
from pytest_reshard.history.loading import HistoryError
from pytest_reshard.history.queries import History
from pytest_reshard.history.records import (Abort, Attempt, Begun, Checkpoint, Delivery, PowerLoss,
                                            Detection, Devices, Ended, Exit, FaultFired, FileEvent,
                                            Generation, MemberEvent, Note, Occurrence, Point,
                                            RankMemory, RankRecord, Replay, RssSample, Saved,
                                            ScenarioRecord, Signal, Started, StepError, StepSpan,
                                            Unfired, LOAD, SAVE, SAVING, STATE,
                                            file_trail)

__all__ = [
    "History", "HistoryError", "ScenarioRecord", "Generation", "Occurrence", "Checkpoint",
    "FaultFired", "Detection", "Torn", "RankMemory", "StepSpan", "Attempt", "Replay",
    "FileEvent", "Saved", "Begun", "Ended", "Started", "Point", "StepError", "Signal", "Exit",
    "Note", "Unfired", "Abort", "Delivery", "Devices", "PowerLoss", "RssSample", "MemberEvent", "RankRecord",
    "file_trail", "SAVING", "SAVE", "LOAD", "STATE",
]
