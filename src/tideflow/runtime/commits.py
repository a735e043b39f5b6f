"""Group commit that survives one bad run: commit a batch, and when that fails, find
which runs can be committed and which cannot.

``commit_apart`` commits the batch in parts: the runs under suspicion (their commit
failed recently) each alone, the others together. A part that fails is split in
halves by run, and each half is tried again, down to single runs, so one poison
run among N costs about 2·log2(N) extra commits and every other run is committed.
When both halves of the first split fail because the store is unavailable and
nothing could be committed, the store is taken to be down: the search stops (a
store that is down must not be asked N times per batch) and nothing is blamed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field

from tideflow.runtime.poison import Failure, classify
from tideflow.store.base import AppliedEvent

Commit = Callable[[Sequence[AppliedEvent]], Awaitable[None]]


@dataclass(slots=True)
class Outcome:
    committed: list[AppliedEvent] = field(default_factory=list)
    failures: dict[str, Exception] = field(default_factory=dict)
    """Runs that could not be committed, even alone, and why."""
    down: Exception | None = None
    """Set when the store looks down: nothing was committed, nothing is blamed."""


async def commit_apart(
    commit: Commit, batch: list[AppliedEvent], suspects: Collection[str]
) -> Outcome:
    """Commit ``batch``: suspects alone, the rest as one group, failing groups bisected."""
    out = Outcome()
    parts = [batch]
    if suspects and any(a.event.run_id in suspects for a in batch):
        rest = [a for a in batch if a.event.run_id not in suspects]
        parts = [rest] if rest else []
        parts.extend(group for run_id, group in by_run(batch).items() if run_id in suspects)
    for part in parts:
        if out.down is not None:
            break
        try:
            await commit(part)
        except Exception as error:
            await _search(commit, part, error, out)
        else:
            out.committed.extend(part)
    return out


async def _search(commit: Commit, part: list[AppliedEvent], error: Exception, out: Outcome) -> None:
    groups = list(by_run(part).values())
    if len(groups) == 1:
        out.failures[groups[0][0].event.run_id] = error
        return
    middle = len(groups) // 2
    halves = [_flat(groups[:middle]), _flat(groups[middle:])]
    errors = [await _try(commit, half) for half in halves]
    for half, half_error in zip(halves, errors, strict=True):
        if half_error is None:
            out.committed.extend(half)
    if not out.committed and all(e is not None and _unavailable(e) for e in errors):
        out.down = error
        return
    for half, half_error in zip(halves, errors, strict=True):
        if half_error is not None and out.down is None:
            await _search(commit, half, half_error, out)


async def _try(commit: Commit, part: Sequence[AppliedEvent]) -> Exception | None:
    try:
        await commit(part)
    except Exception as exc:
        return exc
    return None


def _unavailable(error: Exception) -> bool:
    return classify(error) is Failure.UNAVAILABLE


def _flat(groups: list[list[AppliedEvent]]) -> list[AppliedEvent]:
    return [applied for group in groups for applied in group]


def by_run(batch: Sequence[AppliedEvent]) -> dict[str, list[AppliedEvent]]:
    groups: dict[str, list[AppliedEvent]] = {}
    for applied in batch:
        groups.setdefault(applied.event.run_id, []).append(applied)
    return groups
