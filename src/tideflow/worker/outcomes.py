"""How an attempt that ended is settled: its outcome published, then its task acknowledged.

On a bus where one call for many messages costs less than one each (``Bus.batching_pays``:
a broker over the network), the attempts that end in the same turn of the event loop (a
burst of quick steps) are settled together: their outcomes go out in one
``publish_events`` call (a Redis script call, a JetStream publish batch), then their
tasks are acknowledged in one ``ack_tasks`` call, two round trips for all of them instead
of two each. On the in-process bus each attempt is settled alone, at once: gathering
would cost more than it saves.

Either way a task is acknowledged only after its outcome was published. A failed publish
fails every attempt of the batch, each of which hands its task back to the bus (it comes
again); a failed acknowledgement is logged: the task comes again when its lease runs out,
and the engine takes its outcome again as a duplicate.
"""

from __future__ import annotations

import asyncio
import logging

from tideflow.bus.base import Bus, Delivery, Message
from tideflow.model.commands import DispatchTask
from tideflow.model.events import Event

log = logging.getLogger("tideflow.worker")

Report = Event | Message[Event]
"""An outcome, bare or with its headers (the attempt span's context, when traced)."""
Ended = tuple[Report | None, Delivery[DispatchTask], asyncio.Future[None]]


class Outcomes:
    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self._gather = bus.batching_pays
        self._batch: list[Ended] = []
        self._sending: set[asyncio.Task[None]] = set()

    async def settle(self, event: Report | None, delivery: Delivery[DispatchTask]) -> None:
        """Publish ``event`` (None: nothing to report), then acknowledge ``delivery``;
        raises what the publish raised (the task is then not acknowledged). A caller
        cancelled while it waits leaves the batch alone."""
        if not self._gather:
            if event is not None:
                await self._bus.publish_events([event])
            await self._ack([delivery])
            return
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        if not self._batch:
            loop.call_soon(self._flush)
        self._batch.append((event, delivery, done))
        await done

    def _flush(self) -> None:
        batch, self._batch = self._batch, []
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[Ended]) -> None:
        events = [event for event, _, _ in batch if event is not None]
        try:
            if events:
                await self._bus.publish_events(events)
        except Exception as exc:
            for _, _, done in batch:
                if not done.done():  # (one whose caller stopped waiting is)
                    done.set_exception(exc)
            return
        except BaseException:  # cancelled: the loop is closing
            for _, _, done in batch:
                done.cancel()
            raise
        try:
            await self._ack([delivery for _, delivery, _ in batch])
        finally:
            for _, _, done in batch:
                if not done.done():
                    done.set_result(None)  # taken and acknowledged: the attempt is done

    async def _ack(self, deliveries: list[Delivery[DispatchTask]]) -> None:
        try:
            await self._bus.ack_tasks(deliveries)
        except Exception:
            log.exception(
                "%d task(s) could not be acknowledged; they come again when their lease runs "
                "out (their outcomes are published)",
                len(deliveries),
            )
