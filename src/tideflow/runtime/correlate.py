"""Which runs a signal may be for, found by its correlation rows (dsl/correlation.py).

A `wait` whose ``match`` reads ``signal.<path> == <key>`` is indexed under the row
``name · path · key`` when it starts (``RunState.correlated``); any other wait under its
signal name. A signal with payload ``p`` is for the runs under its name, and, for each path
some registered definition's waits on that name are correlated by, the runs under
``name · path · p[path]``: a few indexed lookups, whatever the number of waiting runs.
The runs found still evaluate the whole ``match`` (the index only narrows).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from tideflow.model.plan import Plan, correlation_row
from tideflow.store.base import Store

__all__ = ["Correlator", "value_at"]

_MISSING = object()


def value_at(payload: Any, path: tuple[str, ...]) -> Any:
    """The payload's value at ``path``, or ``_MISSING``."""
    for part in path:
        if not isinstance(payload, Mapping) or part not in payload:
            return _MISSING
        payload = payload[part]
    return payload


def _paths_of(plans: list[Plan]) -> dict[str, frozenset[tuple[str, ...]]]:
    paths: dict[str, set[tuple[str, ...]]] = defaultdict(set)
    for plan in plans:
        for spec in plan.specs.values():
            wait = spec.wait
            if wait is not None and wait.correlation is not None:
                paths[wait.signal].add(wait.correlation.path)
    return {name: frozenset(found) for name, found in paths.items()}


def _buffers_of(plans: list[Plan]) -> dict[str, float]:
    buffers: dict[str, float] = {}
    for plan in plans:
        for spec in plan.specs.values():
            wait = spec.wait
            if wait is not None:
                buffers[wait.signal] = max(buffers.get(wait.signal, 0.0), wait.buffer)
    return buffers


class Correlator:
    """``candidates(name, payload)``: the runs a signal may be for, from the store's rows."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._known: frozenset[str] = frozenset()
        self._paths: dict[str, frozenset[tuple[str, ...]]] = {}
        self._buffers: dict[str, float] = {}

    async def paths(self, name: str) -> frozenset[tuple[str, ...]]:
        """The payload paths the registered definitions' waits on ``name`` correlate by
        (read again whenever the set of registered definitions changed)."""
        await self._refresh()
        return self._paths.get(name, frozenset())

    async def buffer(self, name: str) -> float:
        """Seconds an event for ``name`` that no wait takes now is kept for one that
        starts later: the longest ``buffer`` of the registered definitions' waits on
        ``name`` (0 when none waits for it)."""
        await self._refresh()
        return self._buffers.get(name, 0.0)

    async def _refresh(self) -> None:
        hashes = frozenset(d.hash for d in await self._store.list_definitions())
        if hashes != self._known:
            plans = [await self._store.get_plan(h) for h in sorted(hashes)]
            self._paths, self._buffers = _paths_of(plans), _buffers_of(plans)
            self._known = hashes

    async def rows(self, name: str, payload: Any) -> list[str]:
        """The wait rows a signal may be found under by a wait that starts later: its name
        and, for each path a wait on ``name`` correlates by, ``name · path · value``."""
        found = [name]
        for path in sorted(await self.paths(name)):
            value = value_at(payload, path)
            row = None if value is _MISSING else correlation_row(name, path, value)
            if row is not None:
                found.append(row)
        return found

    async def candidates(self, name: str, payload: Any) -> list[str]:
        """Runs waiting for ``name`` whose wait is not indexed, and runs whose correlated
        wait's key is the payload's value at its path: each once, in a stable order."""
        found = dict.fromkeys(await self._store.runs_waiting_for(name))
        for path in sorted(await self.paths(name)):
            value = value_at(payload, path)
            if value is _MISSING:
                continue
            row = correlation_row(name, path, value)
            if row is not None:
                found.update(dict.fromkeys(await self._store.runs_waiting_for(row)))
        return list(found)
