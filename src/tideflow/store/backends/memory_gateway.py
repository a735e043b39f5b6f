"""The memory store's record of the event gateway (store/base.py ``keep_event`` and the
rest; runtime/intake.py), apart from the rest of memory.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tideflow.store.base import GatewayEvent


class GatewayRecords:
    """Mixed into MemoryStore, which creates the dicts."""

    _waits: dict[str, set[str]]
    """Signal (wait row) -> run ids (MemoryStore's)."""
    _gateway: dict[str, GatewayEvent]
    """Key -> the event recorded under it."""
    _gateway_rows: dict[str, list[str]]
    """Wait row -> keys of the events buffered under it, in the order they came."""

    async def keep_event(
        self, event: GatewayEvent, wait_rows: Sequence[str] = ()
    ) -> GatewayEvent | None:
        found = self._gateway.get(event.key)
        if found is not None:
            return found
        self._gateway[event.key] = event
        for row in dict.fromkeys(wait_rows):
            self._gateway_rows.setdefault(row, []).append(event.key)
        return None

    async def gateway_event(self, key: str) -> GatewayEvent | None:
        return self._gateway.get(key)

    async def settle_event(self, event: GatewayEvent, was: str) -> bool:
        found = self._gateway.get(event.key)
        if found is None or found.status != was:
            return False
        self._gateway[event.key] = replace(
            found,
            status=event.status,
            delivered_to=event.delivered_to,
            started=event.started,
            reason=event.reason,
        )
        return True

    def _buffered(self, wait_row: str | None, now: float) -> list[GatewayEvent]:
        keys = self._gateway if wait_row is None else self._gateway_rows.get(wait_row, [])
        found = [self._gateway.get(key) for key in keys]
        return [
            e for e in found if e is not None and e.status == "buffered" and e.buffer_until > now
        ]

    async def buffered_events(self, wait_row: str, now: float) -> list[GatewayEvent]:
        return sorted(self._buffered(wait_row, now), key=lambda e: (e.received_at, e.key))

    async def count_buffered(self, now: float, wait_row: str | None = None) -> int:
        return len(self._buffered(wait_row, now))

    async def unmatched_events(
        self, now: float, *, limit: int = 100, after: str | None = None
    ) -> list[GatewayEvent]:
        found = sorted((e for e in self._gateway.values() if e.unmatched(now)), key=lambda e: e.key)
        return [e for e in found if after is None or e.key > after][:limit]

    async def prune_events(self, before: float) -> int:
        doomed = {key for key, e in self._gateway.items() if e.buffer_until < before}
        for key in doomed:
            del self._gateway[key]
        for row, keys in list(self._gateway_rows.items()):
            kept = [key for key in keys if key not in doomed]
            if kept:
                self._gateway_rows[row] = kept
            else:
                del self._gateway_rows[row]
        return len(doomed)

    async def buffered_for_waits(
        self, now: float, limit: int = 1000
    ) -> list[tuple[str, str, GatewayEvent]]:
        found = [
            (run_id, row, self._gateway[key])
            for row, keys in self._gateway_rows.items()
            for key in keys
            for run_id in self._waits.get(row, ())
            if self._gateway[key].status == "buffered" and self._gateway[key].buffer_until > now
        ]
        found.sort(key=lambda one: (one[2].received_at, one[2].key, one[0]))
        return found[:limit]
