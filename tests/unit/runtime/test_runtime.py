"""The embedded runtime end to end: python steps, timers, signals, subflows, emit, cancel."""

from __future__ import annotations

import asyncio
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from tideflow.dsl import compile_definition
from tideflow.errors import InputValidationError, NotFound
from tideflow.runtime.runtime import Runtime
from tideflow.store.backends.memory import MemoryStore
from tideflow.testing.clock import ManualClock
from tideflow.testing.waiting import step_is, wait_until
from tideflow.worker.executors.functions import register, unregister

CALLS: list[str] = []


@pytest.fixture(autouse=True)
def functions():
    CALLS.clear()
    flaky_state = {"n": 0}

    @register("rt.add")
    def add(a: int, b: int) -> int:
        CALLS.append(f"add:{threading.current_thread().name}")
        return a + b

    @register("rt.async_double")
    async def async_double(x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    @register("rt.flaky")
    def flaky() -> str:
        flaky_state["n"] += 1
        if flaky_state["n"] < 3:
            raise ConnectionResetError(f"try {flaky_state['n']}")
        return "third time lucky"

    @register("rt.ctx")
    def with_ctx(ctx: Any) -> dict[str, Any]:
        return {"key": ctx.idempotency_key, "attempt": ctx.attempt}

    @register("rt.slow")
    async def slow() -> None:
        await asyncio.sleep(30)

    yield
    for name in ("rt.add", "rt.async_double", "rt.flaky", "rt.ctx", "rt.slow"):
        unregister(name)


def plan(text: str):  # type: ignore[no-untyped-def]
    return compile_definition(textwrap.dedent(text))


async def test_python_steps_sync_in_threads_async_on_the_loop():
    p = plan(
        """
        name: py
        version: "1"
        input: {type: object, required: [a], properties: {a: {type: integer}}}
        steps:
          - {id: add, type: python, function: rt.add, input: {a: "{{ inputs.a }}", b: 2}}
          - {id: dbl, type: python, function: rt.async_double, depends_on: [add], input: {x: "{{ steps.add.output }}"}}
        output: "{{ steps.dbl.output }}"
        """
    )
    async with Runtime() as rt:
        result = await rt.run(p, {"a": 3})
    assert result.status == "succeeded"
    assert result.output == 10
    assert CALLS and not CALLS[0].endswith("MainThread")


async def test_retry_on_python_base_class_names_and_attempt_count():
    p = plan(
        """
        name: retry
        version: "1"
        steps:
          - id: f
            type: python
            function: rt.flaky
            retry: {max_attempts: 3, backoff: fixed, initial_delay: 10ms, retry_on: [ConnectionError]}
        """
    )
    async with Runtime() as rt:
        result = await rt.run(p)
    assert result.status == "succeeded"
    assert result.steps["f"].attempts == 3
    assert result.steps["f"].output == "third time lucky"


async def test_context_carries_a_stable_idempotency_key():
    p = plan('name: c\nversion: "1"\nsteps: [{id: c, type: python, function: rt.ctx}]\n')
    async with Runtime() as rt:
        result = await rt.run(p)
    assert result.steps["c"].output == {"key": f"{result.run_id}:c", "attempt": 1}


async def test_input_that_does_not_fit_the_schema_is_refused_before_anything_runs():
    p = plan(
        """
        name: typed
        version: "1"
        input: {type: object, required: [n], properties: {n: {type: integer}}}
        steps: [{id: a, type: noop}]
        """
    )
    store = MemoryStore()
    async with Runtime(store=store) as rt:
        with pytest.raises(InputValidationError, match="n"):
            await rt.start_run(p, {"n": "seven"})
        assert (await store.list_runs()).runs == []


async def test_attempt_timeout_cancels_the_running_function():
    p = plan(
        'name: t\nversion: "1"\nsteps: [{id: s, type: python, function: rt.slow, timeout: 50ms}]\n'
    )
    async with Runtime() as rt:
        result = await rt.wait(await rt.start_run(p), timeout=10)
    assert result.status == "failed"
    assert result.error["type"] == "TimeoutError"


async def test_signals_and_durable_timers_with_a_manual_clock():
    p = plan(
        """
        name: approval
        version: "1"
        steps:
          - {id: first, type: wait, signal: approve, timeout: 1h, timeout_action: continue}
          - {id: second, type: wait, signal: approve, depends_on: [first], timeout: 1h, timeout_action: continue}
        output: {first: "{{ steps.first.output }}", second: "{{ steps.second.output }}"}
        """
    )
    clock = ManualClock()
    async with Runtime(clock=clock) as rt:
        run_id = await rt.start_run(p)
        await wait_until(rt, run_id, step_is("first", "waiting"))
        await rt.signal(run_id, "approve", {"by": "ann"})
        await wait_until(rt, run_id, step_is("second", "waiting"))
        assert clock.pending() == [clock.now() + 3600]
        clock.advance(3600)
        result = await rt.wait(run_id, timeout=5)
    assert result.output == {"first": {"by": "ann"}, "second": {"timed_out": True}}


async def test_cancel_a_waiting_run():
    p = plan('name: w\nversion: "1"\nsteps: [{id: w, type: wait, signal: never}]\n')
    async with Runtime() as rt:
        run_id = await rt.start_run(p)
        await wait_until(rt, run_id, step_is("w", "waiting"))
        await rt.cancel(run_id)
        result = await rt.wait(run_id, timeout=5)
    assert result.status == "cancelled"
    assert result.steps["w"].status == "cancelled"


async def test_subflow_sync_and_async_resolve_registered_definitions():
    child = plan(
        """
        name: child
        version: "1"
        input: {type: object, required: [x]}
        steps: [{id: dbl, type: python, function: rt.async_double, input: {x: "{{ inputs.x }}"}}]
        output: "{{ steps.dbl.output }}"
        """
    )
    parent = plan(
        """
        name: parent
        version: "1"
        steps:
          - {id: sync, type: subflow, workflow: child, input: {x: 21}}
          - {id: fire, type: subflow, workflow: child, mode: async, input: {x: 1}}
          - {id: bad, type: subflow, workflow: child, input: {y: 1}, on_error: continue}
        output: {sync: "{{ steps.sync.output }}", fire: "{{ steps.fire.output.run_id }}"}
        """
    )
    async with Runtime() as rt:
        await rt.register(child)
        result = await rt.run(parent)
        fired = await rt.wait(result.output["fire"], timeout=5)
    assert result.status == "succeeded"
    assert result.output["sync"] == 42
    assert fired.status == "succeeded"
    assert fired.output == 2
    assert result.steps["bad"].status == "failed"
    assert "x" in result.steps["bad"].error["message"]


async def test_subflow_resolves_definition_files_in_definitions_dir(tmp_path: Path):
    (tmp_path / "child.yaml").write_text(
        'name: kid\nversion: "2"\nsteps: [{id: s, type: set, values: {v: "{{ inputs.v }}"}}]\n'
        'output: "{{ steps.s.output.v }}"\n'
    )
    (tmp_path / "broken.yaml").write_text("name: [unclosed\n")
    p = plan(
        'name: p\nversion: "1"\nsteps: [{id: k, type: subflow, workflow: kid, input: {v: 5}}]\n'
    )
    async with Runtime(definitions_dir=tmp_path) as rt:
        result = await rt.run(p)
    assert result.steps["k"].output == 5


async def test_unknown_subflow_fails_the_step_clearly():
    p = plan('name: p\nversion: "1"\nsteps: [{id: k, type: subflow, workflow: nowhere}]\n')
    async with Runtime() as rt:
        result = await rt.run(p)
    assert result.status == "failed"
    assert "nowhere" in result.error["message"]


async def test_emit_reaches_waits_in_other_runs_and_sinks():
    listener = plan(
        """
        name: listener
        version: "1"
        steps: [{id: w, type: wait, signal: order.paid, match: "{{ signal.data.order == inputs.order }}"}]
        output: "{{ steps.w.output.data }}"
        """
    )
    emitter = plan(
        """
        name: emitter
        version: "1"
        steps: [{id: e, type: emit, event: {type: order.paid, data: {order: "{{ inputs.order }}"}}}]
        """
    )
    seen: list[dict[str, Any]] = []
    async with Runtime() as rt:
        rt.add_event_sink(seen.append)
        waiting = await rt.start_run(listener, {"order": "A"})
        other = await rt.start_run(listener, {"order": "B"})
        await wait_until(rt, waiting, step_is("w", "waiting"))
        await wait_until(rt, other, step_is("w", "waiting"))
        await rt.run(emitter, {"order": "A"})
        result = await rt.wait(waiting, timeout=5)
        assert (await rt.result(other)).status == "running"
        await rt.cancel(other)
    assert result.output == {"order": "A"}
    assert [e["type"] for e in seen] == ["order.paid"]


async def test_idempotent_start_returns_the_existing_run():
    p = plan('name: i\nversion: "1"\nsteps: [{id: a, type: noop}]\n')
    async with Runtime() as rt:
        first = await rt.start_run(p, idempotency_key="order-1")
        second = await rt.start_run(p, idempotency_key="order-1")
        assert first == second
        await rt.wait(first, timeout=5)


async def test_unknown_run_and_workflow_are_clear_errors():
    async with Runtime() as rt:
        with pytest.raises(NotFound, match="no run"):
            await rt.signal("nope", "x")
        with pytest.raises(NotFound, match="no definition"):
            await rt.start_run("never-registered")


async def test_runs_resume_on_a_new_runtime_over_the_same_store():
    """Force recovery in-process: the first runtime stops mid-run, the second finishes it."""
    p = plan(
        """
        name: resume
        version: "1"
        steps:
          - {id: a, type: python, function: rt.add, input: {a: 1, b: 1}}
          - {id: w, type: wait, signal: go, depends_on: [a]}
          - {id: b, type: python, function: rt.add, depends_on: [w], input: {a: "{{ steps.a.output }}", b: 10}}
        output: "{{ steps.b.output }}"
        """
    )
    store = MemoryStore()
    async with Runtime(store=store) as first:
        run_id = await first.start_run(p)
        await wait_until(first, run_id, step_is("w", "waiting"))
    CALLS.clear()
    async with Runtime(store=store) as second:
        await second.signal(run_id, "go")
        result = await second.wait(run_id, timeout=5)
    assert result.output == 12
    assert len(CALLS) == 1  # `a` did not run again


async def test_a_task_cancelled_in_the_batch_that_dispatched_it_never_runs():
    sent: list[int] = []

    @register("rt.send")
    async def send(n: int) -> int:
        if n < 0:
            raise ValueError("negative")
        await asyncio.sleep(0.05)
        sent.append(n)
        return n

    p = plan(
        """
        name: fan
        version: "1"
        steps:
          - id: fan
            type: map
            items: [-1, -2, 7]
            max_concurrency: 2
            tolerated_failures: 1
            step: {type: python, function: rt.send, input: {n: "{{ item }}"}}
        """
    )
    try:
        async with Runtime() as rt:
            result = await rt.run(p)
            await asyncio.sleep(0.1)
    finally:
        unregister("rt.send")
    assert result.status == "failed"
    assert result.steps["fan[2]"].status == "cancelled"
    assert sent == []


async def test_close_returns_promptly_while_an_attempt_runs():
    p = plan('name: nap\nversion: "1"\nsteps: [{id: s, type: python, function: rt.slow}]\n')
    rt = Runtime()
    await rt.start()
    run_id = await rt.start_run(p)
    await wait_until(rt, run_id, step_is("s", "running"))
    await asyncio.wait_for(rt.close(), timeout=5)


async def test_sensitive_fields_are_masked_in_results_and_history_but_usable_downstream():
    @register("rt.card")
    def card(number: str) -> dict[str, str]:
        return {"card": number, "last4": number[-4:]}

    p = plan(
        """
        name: pay
        version: "1"
        steps:
          - {id: tokenize, type: python, function: rt.card, input: {number: "{{ inputs.number }}"}, sensitive: [card, number]}
          - {id: use, type: set, depends_on: [tokenize], values: {length: "{{ len(steps.tokenize.output.card) }}"}}
        """
    )
    try:
        async with Runtime() as rt:
            result = await rt.run(p, {"number": "4111111111111111"})
            history = await rt.history(result.run_id)
    finally:
        unregister("rt.card")
    assert result.steps["tokenize"].output == {"card": "***", "last4": "1111"}
    assert result.steps["use"].output == {"length": 16}
    assert "4111111111111111" not in repr(history)
    assert "4111111111111111" not in repr(result.to_dict())


async def test_running_instances_keep_their_version_new_runs_use_the_latest(tmp_path: Path):
    v1 = 'name: versioned\nversion: "1.9"\nsteps: [{id: w, type: wait, signal: go}, {id: v, type: set, depends_on: [w], values: {v: 1}}]\noutput: "{{ steps.v.output.v }}"\n'
    v2 = v1.replace('"1.9"', '"1.10"').replace("{v: 1}", "{v: 2}")
    store = f"sqlite:///{tmp_path}/v.db"
    async with Runtime(store=store) as rt:
        await rt.register(v1)
        old = await rt.start_run("versioned")
        await wait_until(rt, old, step_is("w", "waiting"))
        await rt.register(v2)
        new = await rt.start_run("versioned")
        await wait_until(rt, new, step_is("w", "waiting"))
        assert (await rt.state(old)).version == "1.9"
        assert (await rt.state(new)).version == "1.10"
    async with Runtime(store=store) as rt:  # and after a restart, from the store
        await rt.signal(old, "go")
        await rt.signal(new, "go")
        assert (await rt.wait(old, timeout=5)).output == 1
        assert (await rt.wait(new, timeout=5)).output == 2
        with pytest.raises(Exception, match="different content"):
            await rt.register(v1.replace("{v: 1}", "{v: 3}"))


async def test_emit_reaches_a_wait_of_a_run_resumed_from_the_store(tmp_path: Path):
    listener = plan(
        'name: listener\nversion: "1"\nsteps: [{id: w, type: wait, signal: ping}]\n'
        'output: "{{ steps.w.output.data }}"\n'
    )
    emitter = plan(
        'name: emitter\nversion: "1"\nsteps: [{id: e, type: emit, event: {type: ping, data: 1}}]\n'
    )
    store = f"sqlite:///{tmp_path}/emit.db"
    async with Runtime(store=store) as rt:
        waiting = await rt.start_run(listener)
        await wait_until(rt, waiting, step_is("w", "waiting"))
    async with Runtime(store=store) as rt:
        await rt.run(emitter)
        result = await rt.wait(waiting, timeout=5)
        again = await rt.run(emitter)  # nobody waits any more: delivered to no one
    assert result.output == 1
    assert again.status == "succeeded"


async def test_a_non_idempotent_attempt_runs_only_once_its_start_is_committed():
    store = MemoryStore()
    seen: dict[str, list[str]] = {}

    @register("rt.look")
    async def look(ctx: Any) -> str:
        seen[ctx.step_key] = [e.kind for e in await store.history(ctx.run_id)]
        return "ok"

    try:
        p = plan(
            """\
            name: unsure
            version: "1"
            steps:
              - {id: quick, type: python, function: rt.look}
              - {id: pay, type: python, function: rt.look, idempotent: false, depends_on: [quick]}
            """
        )
        async with Runtime(store=store) as rt:
            result = await rt.run(p)
        assert result.status == "succeeded"
        assert seen["pay"][-1] == "task_started"  # committed before the function ran
        history = await store.history(result.run_id)
        assert [e.kind for e in history[-2:]] == ["task_started", "task_completed"]
        assert history[-2].event["step_key"] == "pay"
    finally:
        unregister("rt.look")
