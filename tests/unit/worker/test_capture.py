"""worker/capture.py: what an attempt writes is its own (threads, the event loop, an
isolated child), bounded to its tail, masked, and nothing when it wrote nothing."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

import pytest

from tideflow.model import codec
from tideflow.model.events import TaskCompleted, TaskFailed
from tideflow.runtime.runtime import Runtime
from tideflow.worker import capture
from tideflow.worker.capture import Slot, StepOutput
from tideflow.worker.executors.python import PythonExecutor
from tideflow.worker.secrets import Redactor

from .conftest import ModuleDir, make_ctx

TWO = """
import threading
both = threading.Barrier(2, timeout=20)

def say(name):
    for n in range(3):
        print(name, n)
        both.wait()  # the other attempt's thread writes between our lines
    return name
"""


@pytest.fixture
async def python() -> AsyncIterator[PythonExecutor]:
    executor = PythonExecutor(max_workers=4)
    yield executor
    await executor.aclose()


async def _attempt(python: PythonExecutor, spec: str, value: str) -> Slot:
    slot = capture.begin()  # as the pool does, in the attempt's own task
    await python.execute(make_ctx(), {"function": spec}, {"name": value})
    return slot


async def test_attempts_running_at_once_in_threads_keep_their_lines_apart(
    python: PythonExecutor, modules: ModuleDir, capsys: pytest.CaptureFixture[str]
) -> None:
    mod = modules.write(TWO)
    capture.install()  # here: capsys puts its stream in place as the test begins
    try:
        first, second = await asyncio.gather(
            asyncio.create_task(_attempt(python, f"{mod}:say", "ann")),
            asyncio.create_task(_attempt(python, f"{mod}:say", "bob")),
        )
        print("not an attempt's")  # no attempt in this context: the stream as before
    finally:
        capture.uninstall()
    assert capture.end(first) == {"stdout": {"text": "ann 0\nann 1\nann 2\n", "truncated": 0}}
    assert capture.end(second) == {"stdout": {"text": "bob 0\nbob 1\nbob 2\n", "truncated": 0}}
    out = capsys.readouterr().out  # shown as before, each attempt's lines also kept apart
    assert out.count("ann ") == 3 and out.count("bob ") == 3
    assert out.endswith("not an attempt's\n")


def test_a_stream_keeps_its_last_bytes_and_counts_the_rest() -> None:
    output = StepOutput(limit=1000)
    for n in range(500):
        output.write("stdout", f"{n:04d}\n")  # 2,500 bytes in all
        assert len(output._tails["stdout"]) <= 2000 if output._tails else True
    output.write("log", "WARNING x: hi\n")
    logs = output.result()
    assert logs is not None
    assert logs["stdout"]["truncated"] == 1500
    assert logs["stdout"]["text"] == "".join(f"{n:04d}\n" for n in range(300, 500))
    assert logs["log"] == {"text": "WARNING x: hi\n", "truncated": 0}
    output.write("stdout", "after the end\n")  # an abandoned thread: ignored
    assert output.result() == logs


def test_the_secrets_of_the_attempt_are_masked_even_split_across_writes() -> None:
    output = StepOutput()
    output.redact_with(Redactor(["hunter22-secret"]).redact_text)
    output.write("stderr", "the key is hunter22")
    output.write("stderr", "-secret, keep it\n")
    assert output.result() == {"stderr": {"text": "the key is ***, keep it\n", "truncated": 0}}


def test_an_attempt_that_wrote_nothing_stores_nothing() -> None:
    assert StepOutput().result() is None
    quiet = TaskCompleted(event_id="e", run_id="r", time=1.0, step_key="a", attempt=1, output=1)
    assert "logs" not in codec.event_to_data(quiet)
    logs = {"stdout": {"text": "hi\n", "truncated": 0}}
    chatty = TaskCompleted(
        event_id="e", run_id="r", time=1.0, step_key="a", attempt=1, output=1, logs=logs
    )
    assert codec.event_from_data(codec.event_to_data(chatty)) == chatty


async def test_a_quiet_attempt_gets_no_output_and_a_late_write_is_dropped() -> None:
    async def attempt() -> Slot:
        slot = capture.begin()
        assert slot == []  # nothing made before the first write
        return slot

    quiet = await asyncio.create_task(attempt())
    assert capture.end(quiet) is None
    assert quiet[0].result() is None

    async def late() -> None:  # an abandoned thread writing after the end, in its context
        slot = capture.begin()
        assert capture.end(slot) is None
        dropped = capture.current()
        assert dropped is not None
        dropped.write("stdout", "too late\n")
        assert dropped.result() is None and capture.end(slot) is None

    await asyncio.create_task(late())
    assert capture.current() is None  # no attempt in this context


async def test_a_slot_keeps_the_output_made_by_the_first_write() -> None:
    async def attempt() -> Slot:
        slot = capture.begin()
        output = capture.current()
        assert output is not None and capture.current() is output
        output.write("stderr", "hi\n")
        return slot

    slot = await asyncio.create_task(attempt())
    assert capture.end(slot) == {"stderr": {"text": "hi\n", "truncated": 0}}


def test_uninstall_puts_the_streams_back() -> None:
    before = (sys.stdout, sys.stderr)
    capture.install()
    capture.install()  # a second pool in the process
    capture.uninstall()
    assert sys.stdout is not before[0]  # still routed for the pool left
    capture.uninstall()
    assert (sys.stdout, sys.stderr) == before


FAILS = """
import logging

def boom():
    print("about to fail")
    logging.getLogger("boom").error("it breaks")
    raise ValueError("no")
"""


async def test_a_failed_attempt_keeps_what_it_wrote(modules: ModuleDir) -> None:
    mod = modules.write(FAILS)
    flow = {
        "name": "fails",
        "version": "1",
        "steps": [
            {
                "id": "boom",
                "type": "python",
                "function": f"{mod}:boom",
                "retry": {"max_attempts": 1},
            }
        ],
    }
    async with Runtime(store="memory://", workers=1) as rt:
        result = await rt.run(flow)
        assert result.status == "failed"
        (failed,) = [e for e in await rt.client.history(result.run_id) if e.kind == "task_failed"]
    assert failed.event["logs"] == {
        "stdout": {"text": "about to fail\n", "truncated": 0},
        "log": {"text": "ERROR boom: it breaks\n", "truncated": 0},
    }
    assert isinstance(codec.event_from_data({**failed.event}), TaskFailed)
