"""What a test that hangs past its timeout was waiting for, where CI can read it.

pytest-timeout (``timeout_method = "thread"``) ends a hung test's process with
``os._exit`` after it writes every thread's stack through pytest's terminal writer. In a
pytest-xdist worker that writer does not reach the controller: CI printed only "node
down: Not properly terminated", and a thread's stack shows no more than the event loop's
``run_until_complete`` anyway. This plugin takes the timer over (the hook is
``firstresult``): at the timeout it lifts pytest's capture, writes to the worker's real
stderr (which the controller prints) the test's id, every thread's stack and the stack
of every asyncio task of the loop that runs the test, then ends the process as
pytest-timeout does.
"""

from __future__ import annotations

import asyncio
import gc
import io
import os
import sys
import threading
import traceback
from typing import Any, TextIO

import pytest


def running_loops() -> list[asyncio.AbstractEventLoop]:
    """The event loops running now, in any thread (read from another thread: this is
    for a report, not for driving them)."""
    return [
        obj
        for obj in gc.get_objects()
        if isinstance(obj, asyncio.AbstractEventLoop) and obj.is_running()
    ]


def report(nodeid: str, out: TextIO) -> None:
    """Write what the process is waiting for: threads' stacks, then asyncio tasks'."""
    text = io.StringIO()
    text.write(f"\n+++++ {nodeid} timed out: the stacks of its process +++++\n")
    me = threading.get_ident()
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        if ident != me:
            text.write(f"--- thread {names.get(ident, ident)}\n")
            text.write("".join(traceback.format_stack(frame)))
    for loop in running_loops():
        for _ in range(3):  # the set of tasks may change while it is read
            try:
                tasks = list(asyncio.all_tasks(loop))
                break
            except RuntimeError:
                continue
        else:
            tasks = []
        text.write(f"--- {len(tasks)} asyncio tasks of {type(loop).__name__}\n")
        for task in tasks:
            text.write(f"{task!r}\n")
            for frame in task.get_stack():
                text.write("".join(traceback.format_stack(frame, limit=1)))
    text.write("+++++ end of the stacks +++++\n")
    out.write(text.getvalue())
    out.flush()


def _timed_out(item: pytest.Item) -> None:
    try:
        capman: Any = item.config.pluginmanager.getplugin("capturemanager")
        if capman is not None:
            capman.suspend_global_capture(item)  # fd 2 is the process's stderr again
        report(item.nodeid, sys.__stderr__ or sys.stderr)
    except Exception:
        traceback.print_exc()
    finally:
        os._exit(1)


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    if settings.method != "thread" or settings.timeout <= 0:
        return None  # pytest-timeout's own (the signal method reports in place)
    timer = threading.Timer(settings.timeout, _timed_out, (item,))
    timer.name = f"hangs {item.nodeid}"
    timer.daemon = True

    def cancel() -> None:
        timer.cancel()
        timer.join()

    item.cancel_timeout = cancel  # type: ignore[attr-defined]  # pytest-timeout's
    timer.start()
    return True
