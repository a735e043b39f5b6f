"""A command still stopping a while after SIGTERM logs where each of its tasks waits,
down the chain of awaits, so that a stop that hangs says where."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import pytest

from tideflow.cli import common


async def _inner(gate: asyncio.Event) -> None:
    await gate.wait()


async def _outer(gate: asyncio.Event) -> None:
    await _inner(gate)


async def test_the_report_names_every_frame_down_to_the_future_awaited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = asyncio.Event()
    stuck = asyncio.create_task(_outer(gate), name="stuck-one")
    await asyncio.sleep(0)  # it is suspended in _inner now
    with caplog.at_level(logging.WARNING, logger="tideflow"):
        common.report_stopping(10.0)
    gate.set()
    await stuck
    text = caplog.text
    assert "still stopping 10s after SIGTERM" in text
    assert "task stuck-one:" in text
    assert text.index("in _outer") < text.index("in _inner") < text.index("locks.py")  # Event.wait


async def test_a_stop_that_takes_longer_than_the_report_delay_is_reported(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(common, "STOP_REPORT", 0.05)
    reported = asyncio.Event()
    report = common.report_stopping

    def noted(seconds: float) -> None:
        report(seconds)
        reported.set()

    monkeypatch.setattr(common, "report_stopping", noted)

    async def slow_to_stop() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.wait_for(reported.wait(), 5)  # cleaning up, slowly
            raise

    async def main() -> None:
        stopping = asyncio.ensure_future(common._stopped_by_sigterm(slow_to_stop()))
        await asyncio.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(common._Terminated):
            await stopping

    with caplog.at_level(logging.WARNING, logger="tideflow"):
        await main()
    assert "still stopping 0.05s after SIGTERM" in caplog.text
    assert "in slow_to_stop" in caplog.text
