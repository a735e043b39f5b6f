"""The traceback recorded for a failing python step starts at the user's function:
the engine frames that called it (worker pool, executor, thread pool, isolated child)
are left out, in every way a function can run."""

from __future__ import annotations

import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tideflow import Runtime

USER_CODE = """
import asyncio

def failing_sync():
    return helper()

async def failing_async():
    await asyncio.sleep(0)
    return helper()

def wrapping():
    try:
        helper()
    except ValueError as exc:
        raise RuntimeError("wrapped") from exc

def helper():
    raise ValueError("bad value")
"""


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = f"tb_user_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(USER_CODE), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def _frames(details: str) -> list[str]:
    return [line.strip() for line in details.splitlines() if line.strip().startswith("File ")]


@pytest.mark.parametrize(
    ("function", "isolation", "first"),
    [
        ("failing_sync", None, "in failing_sync"),
        ("failing_async", None, "in failing_async"),
        ("failing_sync", "process", "in failing_sync"),
        ("failing_async", "process", "in failing_async"),
    ],
    ids=["thread", "async", "process", "process-async"],
)
async def test_the_traceback_starts_at_the_users_function(
    user_module: str, function: str, isolation: str | None, first: str
) -> None:
    extra = f", isolation: {isolation}" if isolation else ""
    definition = f"""
name: tb
version: "1"
steps:
  - {{id: s, type: python, function: "{user_module}:{function}"{extra}}}
"""
    async with Runtime() as rt:
        result = await rt.wait(await rt.start_run(await rt.register(definition)), 60)

    error = result.steps["s"].error
    assert error is not None
    assert (error["type"], error["message"]) == ("ValueError", "bad value")
    frames = _frames(error["details"])
    assert len(frames) == 2, error["details"]
    assert f"{user_module}.py" in frames[0] and frames[0].endswith(first)
    assert frames[1].endswith("in helper")
    assert error["details"].startswith("Traceback (most recent call last):\n")
    assert "tideflow" not in error["details"].replace(user_module, "")


async def test_a_chained_exception_is_trimmed_too(user_module: str) -> None:
    definition = f"""
name: tb
version: "1"
steps:
  - {{id: s, type: python, function: "{user_module}:wrapping"}}
"""
    async with Runtime() as rt:
        result = await rt.wait(await rt.start_run(await rt.register(definition)), 60)

    error = result.steps["s"].error
    assert error is not None and error["type"] == "RuntimeError"
    cause, _, effect = error["details"].partition("The above exception was the direct cause")
    assert _frames(cause)[0].endswith("in wrapping") and _frames(cause)[1].endswith("in helper")
    assert _frames(effect)[0].endswith("in wrapping") and len(_frames(effect)) == 1
    assert "worker/" not in error["details"]
