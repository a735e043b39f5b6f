"""JetStream pull requests with one inbox per consumer, for the NATS bus.

nats-py's ``fetch`` hides what the bus needs to see: which consumer a message or a
status (404 no messages, 408 request expired) answers, and how many requested
slots are still open on the server. Here every consumer the bus reads ("lane":
a queue x priority, or an event partition) gets its own reply subject
``<inbox>.<index>`` under one wildcard subscription (a status answers on it; a
message keeps its subject, and its metadata names the consumer), so a request's slots are
counted until they are filled or ended by a status. ``no_wait`` requests answer at
once; lingering ones (``expires``) stand on the server and take a message the
moment one is available, including a redelivery after a nack delay or a lease.

A reconnect (the broker restarted, or the link dropped) loses every request standing on
the server, and a broker that crashed may have lost a consumer made shortly before (its
file store syncs its metadata lazily): ``reconnected`` ends the open requests at once
(instead of after ``ANSWER_GRACE``) and has each lane's consumer made again (``ensure``,
idempotent) before its next request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.aio.subscription import Subscription

log = logging.getLogger("tideflow.bus.nats")

ANSWER_GRACE = 5.0
"""Seconds past its expiry after which a request nobody answered (a reconnect lost
it) no longer counts as open."""


@dataclass(eq=False)
class Lane:
    """One durable consumer this reader pulls from."""

    index: int
    stream: str
    consumer: str
    rank: int = 0
    label: str = ""
    """What an operator calls it: ``default/high``, ``partition 3``."""
    open: int = 0
    """Slots requested and neither filled nor ended."""
    lingering: bool = False
    deadline: float = 0.0
    delivered: bool = field(default=False)
    """It delivered something since the reader last looked."""
    subject: str = ""
    """The consumer's filter subject (to make it again)."""
    stale: bool = False
    """The link was lost since its consumer was last made sure of."""


class Puller:
    """Pull requests for a set of lanes; what they deliver collects in ``arrived``."""

    def __init__(self, nc: Client, ensure: Callable[[Lane], Awaitable[None]]) -> None:
        self._nc = nc
        self._ensure = ensure
        self._inbox = nc.new_inbox()
        self._sub: Subscription | None = None
        self.lanes: list[Lane] = []
        self._by_consumer: dict[str, Lane] = {}
        self.arrived: deque[tuple[Lane, Msg]] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._woken = False
        """A wake that came while nobody waited: the next wait returns at once."""

    async def start(self) -> None:
        self._sub = await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_message)

    def add(
        self, stream: str, consumer: str, subject: str, *, rank: int = 0, label: str = ""
    ) -> Lane:
        lane = Lane(len(self.lanes), stream, consumer, rank, label, subject=subject)
        self.lanes.append(lane)
        self._by_consumer[consumer] = lane
        return lane

    def open_slots(self, *, standing: bool = True) -> int:
        """Slots requested and not yet filled or ended (``standing=False``: of ``no_wait``
        requests only, which the server answers at once)."""
        return sum(lane.open for lane in self.lanes if standing or not lane.lingering)

    async def request(self, lane: Lane, batch: int, *, linger: float | None = None) -> None:
        """Ask ``lane`` for up to ``batch`` messages: those available now (``linger``
        None), or the next ones within ``linger`` seconds."""
        if lane.stale:
            await self._ensure(lane)
            lane.stale = False
        body: dict[str, object] = {"batch": batch}
        if linger is None:
            body["no_wait"] = True
        else:
            body["expires"] = int(linger * 1e9)
        lane.open = batch
        lane.lingering = linger is not None
        lane.deadline = time.monotonic() + (linger or 0.0) + ANSWER_GRACE
        await self._nc.publish(
            f"$JS.API.CONSUMER.MSG.NEXT.{lane.stream}.{lane.consumer}",
            orjson.dumps(body),
            reply=f"{self._inbox}.{lane.index}",
        )

    async def answered(self, lane: Lane) -> None:
        """Wait until ``lane``'s request is filled or ended. A ``wake`` meant for the
        reader that comes meanwhile ends here: what wakes it for another reason leaves a
        mark the reader looks at before it waits (a queue found, a bell rung, a lock
        lost)."""
        while lane.open:
            await self.wait(lane.deadline - time.monotonic())
            self.forget_lost()

    async def wait(self, timeout: float) -> None:
        """Until something arrives or ``wake`` is called, at most ``timeout`` seconds."""
        if self._woken or timeout <= 0:
            self._woken = False
            return
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            # asyncio.timeout, not wait_for: in 3.11 wait_for can swallow a cancel that
            # races its timeout, and the reader, closed by its consumer, would pull on
            async with asyncio.timeout(timeout):
                await self._waiter
        except TimeoutError:
            pass
        finally:
            self._waiter = None

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is None:
            self._woken = True
        elif not waiter.done():
            waiter.set_result(None)

    def next_deadline(self) -> float:
        deadlines = [lane.deadline for lane in self.lanes if lane.open]
        return min(deadlines) if deadlines else float("inf")

    def reconnected(self) -> None:
        """The link came back: what stood on the server is gone; ask again at once."""
        for lane in self.lanes:
            lane.open = 0
            lane.stale = True
        self.wake()

    def forget_lost(self) -> None:
        now = time.monotonic()
        for lane in self.lanes:
            if lane.open and lane.deadline <= now:
                log.warning("a pull request on %s was never answered; asking again", lane.label)
                lane.open = 0

    async def close(self) -> None:
        """Stop listening; the server drops the requests left standing (no interest)."""
        if self._sub is not None:
            sub, self._sub = self._sub, None
            await sub.unsubscribe()

    async def _on_message(self, msg: Msg) -> None:
        status = msg.headers.get("Status") if msg.headers else None
        if status is not None and not msg.reply:
            try:  # a status comes on the reply subject of its request
                lane = self.lanes[int(msg.subject.rsplit(".", 1)[1])]
            except (ValueError, IndexError):
                return
            if status != "100":  # 100: an idle heartbeat
                if status not in ("404", "408"):
                    description = msg.headers.get("Description", "") if msg.headers else ""
                    log.warning("pull request on %s ended: %s %s", lane.label, status, description)
                lane.open = 0
                self.wake()
            return
        # a message keeps its own subject; its ack subject names the consumer
        try:
            owner = self._by_consumer.get(msg.metadata.consumer)
        except Exception:  # not a JetStream message: nothing this reader asked for
            return
        if owner is None:
            return
        lane = owner
        lane.open = max(0, lane.open - 1)
        lane.delivered = True
        self.arrived.append((lane, msg))
        self.wake()
