"""The feeds behind the event streams (api/feeds.py): every stream of one view shares one
read per burst of changes, and the first read, and its error; a slow reader holds no one
up; a feed stops when its last reader leaves, its run ended or a read failed."""

from __future__ import annotations

import asyncio

import pytest
from tests.processes import eventually

import tideflow.api.feeds as feeds
from tideflow.api.changes import RunChanges
from tideflow.api.feeds import Feeds, Reader
from tideflow.errors import NotFound, StoreUnavailable


class View:
    """A view whose every read is a new text (``n`` reads so far), or what ``fail`` says."""

    def __init__(self, *, last_after: int | None = None) -> None:
        self.reads = 0
        self.last_after = last_after
        self.fail: Exception | None = None
        self.gate: asyncio.Event | None = None

    async def read(self) -> tuple[str, bool]:
        self.reads += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return f'{{"n": {self.reads}}}', self.last_after is not None and (
            self.reads >= self.last_after
        )


@pytest.fixture(autouse=True)
def only_changes_wake_a_feed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(feeds, "RECHECK", 600.0)


async def texts(readers: list[Reader]) -> list[str | None]:
    return list(await asyncio.gather(*(r.next(10) for r in readers)))


async def test_the_streams_of_one_view_share_its_first_read_and_one_read_per_burst() -> None:
    changes, view = RunChanges(), View()
    hub = Feeds(changes)
    readers = await asyncio.gather(*(hub.join("all", None, view.read) for _ in range(100)))
    assert view.reads == 1 and hub.open == 1 and changes.watching == 1
    assert {r.take() for r in readers} == {'{"n": 1}'}
    for i in range(200):  # a burst: one read, for every stream
        changes.changed(f"run-{i}")
    assert set(await texts(readers)) == {'{"n": 2}'}
    assert view.reads == 2
    changes.changed("run-0")
    assert set(await texts(readers)) == {'{"n": 3}'}
    assert view.reads == 3


async def test_a_run_view_is_read_again_for_its_own_run_only() -> None:
    changes, mine, other = RunChanges(), View(), View()
    hub = Feeds(changes)
    reader = await hub.join(("run", "r1"), "r1", mine.read)
    others = await hub.join(("run", "r2"), "r2", other.read)
    reader.take(), others.take()
    changes.changed("r2")
    assert await others.next(10) == '{"n": 2}'
    changes.changed("r1")
    assert await reader.next(10) == '{"n": 2}'
    assert (mine.reads, other.reads) == (2, 2)


async def test_a_slow_reader_holds_no_one_up_and_skips_to_the_newest_view() -> None:
    changes, view = RunChanges(), View()
    hub = Feeds(changes)
    slow, quick = [await hub.join("all", None, view.read) for _ in range(2)]
    slow.take(), quick.take()
    for n in (2, 3, 4):
        changes.changed("r")
        assert await quick.next(10) == f'{{"n": {n}}}'
    assert await slow.next(10) == '{"n": 4}'


async def test_the_first_reads_error_is_every_joiners_and_the_next_join_reads_again() -> None:
    changes, view = RunChanges(), View()
    view.fail, view.gate = NotFound("no run r1"), asyncio.Event()
    hub = Feeds(changes)
    joins = [asyncio.create_task(hub.join(("run", "r1"), "r1", view.read)) for _ in range(5)]
    assert await eventually(lambda: view.reads == 1)
    view.gate.set()
    outcomes = await asyncio.gather(*joins, return_exceptions=True)
    assert all(isinstance(o, NotFound) for o in outcomes) and view.reads == 1
    assert hub.open == 0
    assert await eventually(lambda: changes.watching == 0)
    view.fail = None
    reader = await hub.join(("run", "r1"), "r1", view.read)
    assert (reader.take(), view.reads) == ('{"n": 2}', 2)


async def test_a_feed_stops_when_its_last_reader_leaves() -> None:
    changes, view = RunChanges(), View()
    hub = Feeds(changes)
    first, second = [await hub.join("all", None, view.read) for _ in range(2)]
    first.close()
    assert hub.open == 1 and changes.watching == 1
    second.close()
    assert hub.open == 0
    assert await eventually(lambda: changes.watching == 0)
    changes.changed("r")
    again = await hub.join("all", None, view.read)  # a new feed: its own first read
    assert (again.take(), view.reads) == ('{"n": 2}', 2)


async def test_readers_send_the_last_view_of_an_ended_run_then_end() -> None:
    changes, view = RunChanges(), View(last_after=2)
    hub = Feeds(changes)
    reader = await hub.join(("run", "r1"), "r1", view.read)
    assert reader.take() == '{"n": 1}' and not reader.over
    changes.changed("r1")
    assert await reader.next(10) == '{"n": 2}'
    assert reader.over and await reader.next(10) is None
    assert hub.open == 0


async def test_a_failed_read_is_a_problem_its_readers_tell() -> None:
    changes, view = RunChanges(), View()
    hub = Feeds(changes)
    reader = await hub.join("all", None, view.read)
    reader.take()
    view.fail = NotFound("run r1 is gone")
    changes.changed("r")
    assert await reader.next(10) is None
    assert reader.over and reader.problem == "run r1 is gone"
    assert hub.open == 0


async def test_a_failed_read_of_the_service_tells_what_failed_not_its_message() -> None:
    changes, view = RunChanges(), View()
    hub = Feeds(changes)
    reader = await hub.join("all", None, view.read)
    reader.take()
    view.fail = StoreUnavailable("db.internal:5432 refused the connection")
    changes.changed("r")
    assert await reader.next(10) is None
    assert reader.problem is not None and "db.internal" not in reader.problem
    assert reader.problem.startswith("The store cannot be reached or is busy right now")


async def test_a_server_that_stops_ends_every_reader() -> None:
    changes, view = RunChanges(), View()
    hub = Feeds(changes)
    readers = [await hub.join(key, None, view.read) for key in ("a", "b")]
    for reader in readers:
        reader.take()
    changes.close()
    assert await texts(readers) == [None, None]
    assert all(r.over and r.problem is None for r in readers)
