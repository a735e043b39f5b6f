"""Outcomes on their way to the engine, published together.

Attempts that end in the same turn of the event loop (a burst of quick steps) send
their outcomes in one ``publish_events`` call, not one each: on a broker that is one
round trip (a Redis script call, a JetStream publish batch) for all of them. Each
attempt still learns whether its own outcome was taken, and acknowledges its task
only then; a failed publish fails every outcome of the batch, each of which is then
handed back to the bus (and comes again).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from tideflow.model.events import Event

Publish = Callable[[Sequence[Event]], Awaitable[None]]


class Outcomes:
    def __init__(self, publish: Publish) -> None:
        self._publish = publish
        self._batch: list[tuple[Event, asyncio.Future[None]]] = []
        self._sending: set[asyncio.Task[None]] = set()

    def send(self, event: Event) -> asyncio.Future[None]:
        """Publish ``event`` with the others sent in this turn of the loop; the future
        ends when it was taken (or with what the publish raised). Cancelling it leaves
        the batch alone."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        if not self._batch:
            loop.call_soon(self._flush)
        self._batch.append((event, done))
        return done

    def _flush(self) -> None:
        batch, self._batch = self._batch, []
        task = asyncio.get_running_loop().create_task(self._publish_all(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _publish_all(self, batch: list[tuple[Event, asyncio.Future[None]]]) -> None:
        error: BaseException | None = None
        try:
            await self._publish([event for event, _ in batch])
        except Exception as exc:
            error = exc
        except BaseException as exc:  # cancelled: the loop is closing
            error = exc
            raise
        finally:
            for _, done in batch:
                if done.done():
                    continue  # its sender stopped waiting
                if error is None:
                    done.set_result(None)
                elif isinstance(error, Exception):
                    done.set_exception(error)
                else:
                    done.cancel()
