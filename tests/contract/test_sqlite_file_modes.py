"""The SQLite file, its WAL and its shared-memory file are readable by their owner only.

The umask is set to the common 022 (which gives 0644 files) for each test, so a mode
of 0600 comes from the store and not from the machine's settings.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tideflow.dsl import compile_definition
from tideflow.store.backends.sqlite import SqliteStore

from .conftest import compile_stored

PLAN = compile_definition({"name": "modes", "version": "1", "steps": [{"id": "a", "type": "noop"}]})


@pytest.fixture(autouse=True)
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


async def test_a_new_database_its_wal_and_shm_are_0600_in_a_0700_directory(
    tmp_path: Path,
) -> None:
    path = tmp_path / "work" / ".tideflow" / "tideflow.db"
    store = SqliteStore(f"sqlite:///{path}", compile_plan=compile_stored)
    await store.open()
    try:
        await store.save_definition(PLAN)  # a write: the WAL has content
        files = [path, Path(f"{path}-wal"), Path(f"{path}-shm")]
        assert [mode(f) for f in files] == [0o600, 0o600, 0o600]
        assert mode(path.parent) == 0o700
        assert mode(path.parent.parent) == 0o700  # every directory the store made
    finally:
        await store.close()


async def test_an_existing_world_readable_file_keeps_its_mode_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "shared.db"
    first = SqliteStore(f"sqlite:///{path}", compile_plan=compile_stored)
    await first.open()
    await first.close()
    os.chmod(path, 0o644)  # as an operator may have set it
    with caplog.at_level(logging.WARNING, logger="tideflow.store"):
        store = SqliteStore(f"sqlite:///{path}", compile_plan=compile_stored)
        await store.open()
        await store.close()
    assert mode(path) == 0o644
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(path) in w and "chmod 600" in w for w in warnings), warnings


async def test_a_private_existing_file_gives_no_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "private.db"
    with caplog.at_level(logging.WARNING, logger="tideflow.store"):
        for _ in range(2):
            store = SqliteStore(f"sqlite:///{path}", compile_plan=compile_stored)
            await store.open()
            await store.close()
    assert mode(path) == 0o600
    assert not [r for r in caplog.records if "chmod" in r.getMessage()]
