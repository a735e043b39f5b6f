"""A task reader's presence on a broker bus, announced at its start and renewed by a task
of its own until it stops (the Redis and NATS backends say *where* and *how* in
``announce`` and what ``withdraw`` removes; this says *when*)."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod

from tideflow.bus.base import presence_ttl
from tideflow.bus.closing import cancel_and_wait, cancels_asked, raise_dropped_cancel


class Presence(ABC):
    renewer_name: str
    """The renewing task's name (``tideflow-<bus>-presence``)."""

    def __init__(self, lease: float) -> None:
        self.ttl = presence_ttl(lease)
        """How long the presence outlives its last renewal (a backend may lower it to
        what the broker keeps); renewed every third of it."""
        self._renewer: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Announce the reader. Its renewer exists from before that announcement can be
        read, so a reader anyone sees listed always has one (a start cut short takes it
        away again); it renews once the announcement is made, at the ``ttl`` that
        announcement may have lowered."""
        announced = asyncio.Event()
        self._renewer = asyncio.create_task(self._renew(announced), name=self.renewer_name)
        try:
            await self.announce()
        except BaseException:
            self._renewer.cancel()
            self._renewer = None
            raise
        announced.set()

    async def stop(self) -> None:
        """Stop renewing, then withdraw what was announced."""
        if self._renewer is not None:
            await cancel_and_wait(self._renewer)
            self._renewer = None
        await self.withdraw()

    async def _renew(self, announced: asyncio.Event) -> None:
        asked = cancels_asked()
        await announced.wait()
        while True:
            # the presence's heartbeat, not a wait on a condition
            await asyncio.sleep(self.ttl / 3)
            await self.announce()
            raise_dropped_cancel(asked)  # one the broker's client dropped: it ends here

    @abstractmethod
    async def announce(self) -> None:
        """Write the reader's presence (and its beat); a broker failure is logged, not
        raised (the reader reads on, uncounted for now)."""

    @abstractmethod
    async def withdraw(self) -> None:
        """Remove what ``announce`` wrote (failures ignored: a lapsed entry is harmless)."""


__all__ = ["Presence"]
