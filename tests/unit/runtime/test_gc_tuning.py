"""The garbage collector's first threshold while a runtime runs (runtime/gc_tuning.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from tideflow.runtime import gc_tuning
from tideflow.runtime.runtime import Runtime
from tideflow.store.backends.memory import MemoryStore


@pytest.fixture(autouse=True)
def cpython_default() -> Iterator[None]:
    """Every test starts from CPython's default threshold and leaves the process's own."""
    saved = gc.get_threshold()
    gc.set_threshold(gc_tuning.CPYTHON_DEFAULT, saved[1], saved[2])
    yield
    gc.set_threshold(*saved)


def first() -> int:
    return gc.get_threshold()[0]


async def test_raised_while_a_runtime_runs_and_put_back_when_it_stops() -> None:
    rest = gc.get_threshold()[1:]
    async with Runtime():
        assert first() == gc_tuning.DEFAULT_THRESHOLD
        assert gc.get_threshold()[1:] == rest  # the other two are not changed
    assert first() == gc_tuning.CPYTHON_DEFAULT


async def test_put_back_when_the_last_of_several_runtimes_stops() -> None:
    async with Runtime(gc_threshold=5_000):
        async with Runtime(gc_threshold=20_000):
            assert first() == 5_000  # the first runtime's
        assert first() == 5_000  # still one running
    assert first() == gc_tuning.CPYTHON_DEFAULT


async def test_none_leaves_the_collector_alone() -> None:
    async with Runtime(gc_threshold=None):
        assert first() == gc_tuning.CPYTHON_DEFAULT


async def test_a_threshold_the_application_chose_is_left_alone() -> None:
    gc.set_threshold(1_234)
    async with Runtime():
        assert first() == 1_234
    assert first() == 1_234


async def test_a_threshold_changed_while_running_is_not_overwritten() -> None:
    async with Runtime():
        gc.set_threshold(50_000)
    assert first() == 50_000


async def test_put_back_when_the_runtime_fails_to_start() -> None:
    class Broken(MemoryStore):
        async def open(self) -> None:
            raise OSError("store unreachable")

    with pytest.raises(OSError, match="store unreachable"):
        async with Runtime(store=Broken()):
            pass
    assert first() == gc_tuning.CPYTHON_DEFAULT


def test_a_threshold_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="gc_threshold must be a positive number"):
        Runtime(gc_threshold=0)
