"""What the crash tests read after a crash: the store's committed outcomes and the
step functions' execution log (``crash_steps``)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tideflow.errors import NotFound
from tideflow.store import Store
from tideflow.store.base import HistoryEntry

Instance = tuple[str, str, bool]
"""A step instance: (run id, step key, compensation)."""

ENDED = frozenset({"succeeded", "failed", "cancelled", "compensated", "compensation_failed"})


@dataclass
class StoreView:
    """What the store holds at one moment (nothing running on it)."""

    statuses: dict[str, str] = field(default_factory=dict)
    """Run id -> status, for the runs that exist."""
    outputs: dict[str, Any] = field(default_factory=dict)
    outcomes: Counter[tuple[Instance, int]] = field(default_factory=Counter)
    """Committed ``task_completed``/``task_failed`` events per (instance, attempt)."""
    completions: Counter[Instance] = field(default_factory=Counter)
    """Committed ``task_completed`` events per instance."""
    latest: dict[tuple[str, str], str] = field(default_factory=dict)
    """(run id, history subject) -> the status its last recorded transition went to."""
    damage: list[str] = field(default_factory=list)
    """What is wrong with the histories themselves: sequence gaps, an event applied twice."""

    def committed(self, instance: Instance) -> int:
        return sum(n for (inst, _), n in self.outcomes.items() if inst == instance)

    def add_history(self, run_id: str, history: list[HistoryEntry]) -> None:
        seqs = [entry.seq for entry in history]
        if seqs != list(range(1, len(seqs) + 1)):
            self.damage.append(f"run {run_id}: history sequence numbers {seqs}")
        ids = Counter(entry.event.get("event_id") for entry in history)
        self.damage += [
            f"run {run_id}: event {i} applied {n} times" for i, n in ids.items() if n > 1
        ]
        for entry in history:
            if entry.kind in ("task_completed", "task_failed"):
                event = entry.event
                instance = (run_id, event["step_key"], bool(event.get("compensation")))
                self.outcomes[(instance, int(event["attempt"]))] += 1
                if entry.kind == "task_completed":
                    self.completions[instance] += 1
            for transition in entry.transitions:
                self.latest[(run_id, transition["subject"])] = transition["new"]


async def observe(store: Store, run_ids: Iterable[str]) -> StoreView:
    """Read the runs (those that exist) and their histories from an open store."""
    view = StoreView()
    for run_id in run_ids:
        try:
            summary = await store.get_run(run_id)
        except NotFound:  # not created before the crash
            continue
        view.statuses[run_id] = summary.status
        view.outputs[run_id] = summary.output
        view.add_history(run_id, await store.history(run_id))
    return view


@dataclass(frozen=True)
class Execution:
    """One line of the execution log: a step function entered (``start``) or left (``end``)."""

    instance: Instance
    attempt: int
    idempotency_key: str
    pid: int
    phase: str

    @property
    def expected_key(self) -> str:
        """The idempotency key every execution of this instance must carry."""
        run_id, key, compensation = self.instance
        return f"{run_id}:{key}:compensate" if compensation else f"{run_id}:{key}"


def read_log(path: Path, offset: int = 0) -> tuple[list[Execution], int]:
    """The log lines written since byte ``offset``, and the offset after them."""
    if not path.exists():
        return [], offset
    data = path.read_bytes()
    data = data[: data.rfind(b"\n") + 1]  # complete lines only: a writer may be mid-line
    executions = []
    for raw in data[offset:].splitlines():
        if not raw:
            continue
        try:
            line = json.loads(raw)
        except json.JSONDecodeError:
            # Torn by SIGKILL: Linux may cut a write() to a file where it crosses a
            # page boundary when a fatal signal is pending, so a killed process can
            # leave part of a record. Each record begins with its own newline, so the
            # next process's record still starts a line of its own and only the torn
            # part, of a step that never returned, is lost.
            continue
        executions.append(
            Execution(
                instance=(line["run_id"], line["step_key"], line["compensation"]),
                attempt=line["attempt"],
                idempotency_key=line["idempotency_key"],
                pid=line["pid"],
                phase=line["phase"],
            )
        )
    return executions, len(data)
