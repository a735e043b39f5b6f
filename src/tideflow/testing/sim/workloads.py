"""What the simulation runs: workflows of every shape, each with the end it must reach.

A workload is a definition, an input, what the simulator does to the run from outside
(signals, cancels) and what the run must end as: its status, its output, and per step
the status and attempts the retry policy allows. The step functions are async (they run
on the simulation's loop, never in a thread) and decide their outcome from their input
and attempt number only, never from how often they were called: a duplicated delivery
or an attempt run again after a lost outcome must not change the run's end.
"""

from __future__ import annotations

import asyncio
import functools
import random
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tideflow.dsl import compile_definition
from tideflow.model.plan import Plan
from tideflow.worker.executors.base import StepContext
from tideflow.worker.executors.functions import register, registered_function

JOURNAL: list[tuple[str, str, int]] = []
"""(run id, step key or ``undo:<name>``, attempt) of every call of a step function, in
call order (the simulation clears it for each seed)."""


async def work(x: int, ctx: StepContext) -> int:
    JOURNAL.append((ctx.run_id, ctx.step_key, ctx.attempt))
    return x + 1


async def flaky(fail_until: int, ctx: StepContext) -> str:
    """Fails attempts 1..``fail_until`` (a connection error: retryable), then succeeds."""
    JOURNAL.append((ctx.run_id, ctx.step_key, ctx.attempt))
    if ctx.attempt <= fail_until:
        raise ConnectionError(f"attempt {ctx.attempt} of {ctx.step_key} fails, as planned")
    return f"ok after {ctx.attempt}"


async def hang(ctx: StepContext) -> None:
    """Never ends by itself (a day of virtual time): its step's timeout ends it."""
    JOURNAL.append((ctx.run_id, ctx.step_key, ctx.attempt))
    await asyncio.sleep(86_400.0)


async def undo(name: str, ctx: StepContext) -> str:
    JOURNAL.append((ctx.run_id, f"undo:{name}", ctx.attempt))
    return f"undone {name}"


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sim.work": work,
    "sim.flaky": flaky,
    "sim.hang": hang,
    "sim.undo": undo,
}


def register_functions() -> None:
    """Register the step functions (once; ``tideflow.register`` is process-wide)."""
    for name, fn in FUNCTIONS.items():
        if registered_function(name) is None:
            register(name)(fn)


@functools.lru_cache(maxsize=64)
def _plan(text: str) -> Plan:
    """Compiled once per text (a plan is immutable; every seed builds its workloads)."""
    return compile_definition(textwrap.dedent(text))


CHILD = _plan(
    """
    name: sim_child
    version: "1"
    steps:
      - {id: a, type: python, function: sim.work, input: {x: "{{ inputs.x }}"}}
      - {id: b, type: python, function: sim.work, input: {x: "{{ steps.a.output }}"},
         depends_on: [a]}
    output: "{{ steps.b.output }}"
    """
)


@dataclass(frozen=True, slots=True)
class StepEnd:
    status: str
    attempts: int | None = None
    """Exactly this many attempts (None: not checked beyond the policy's bound)."""
    error: str | None = None


@dataclass(slots=True)
class Workload:
    kind: str
    run_id: str
    plan: Plan
    input: dict[str, Any]
    status: str
    """The status the run must end in."""
    output: Any = None
    check_output: bool = True
    steps: dict[str, StepEnd] = field(default_factory=dict)
    max_attempts: dict[str, int] = field(default_factory=dict)
    """Step key -> the attempts its retry policy allows (1 when absent)."""
    signal: tuple[float, str, Any] | None = None
    """(virtual seconds after the start, name, payload) of a signal the simulator sends."""
    cancel_at: float | None = None
    compensations: list[str] = field(default_factory=list)
    """Steps whose compensation must run, in the order they must run (reverse completion:
    checked against the history)."""
    children: list[str] = field(default_factory=list)


Build = Callable[[random.Random, str], Workload]


def chain(rng: random.Random, run_id: str) -> Workload:
    x = rng.randrange(100)
    plan = _plan(
        """
        name: sim_chain
        version: "1"
        steps:
          - {id: a, type: python, function: sim.work, input: {x: "{{ inputs.x }}"}}
          - {id: b, type: python, function: sim.work, input: {x: "{{ steps.a.output }}"},
             depends_on: [a]}
          - {id: c, type: python, function: sim.work, input: {x: "{{ steps.b.output }}"},
             depends_on: [b]}
        output: "{{ steps.c.output }}"
        """
    )
    ends = {k: StepEnd("succeeded", 1) for k in "abc"}
    return Workload("chain", run_id, plan, {"x": x}, "succeeded", x + 3, steps=ends)


def fan(rng: random.Random, run_id: str) -> Workload:
    x = rng.randrange(100)
    plan = _plan(
        """
        name: sim_fan
        version: "1"
        steps:
          - {id: root, type: noop, input: {x: "{{ inputs.x }}"}}
          - {id: b0, type: python, function: sim.work, input: {x: "{{ steps.root.output.x }}"},
             depends_on: [root]}
          - {id: b1, type: python, function: sim.work,
             input: {x: "{{ steps.root.output.x + 1 }}"}, depends_on: [root]}
          - {id: b2, type: python, function: sim.work, input: {x: 10}, depends_on: [root]}
          - id: join
            type: set
            depends_on: [b0, b1, b2]
            values: {total: "{{ steps.b0.output + steps.b1.output + steps.b2.output }}"}
        output: "{{ steps.join.output.total }}"
        """
    )
    ends = {k: StepEnd("succeeded", 1) for k in ("b0", "b1", "b2")}
    ends["join"] = StepEnd("succeeded")
    return Workload("fan", run_id, plan, {"x": x}, "succeeded", (x + 1) + (x + 2) + 11, steps=ends)


def mapped(rng: random.Random, run_id: str) -> Workload:
    items = [rng.randrange(50) for _ in range(rng.randrange(0, 6))]
    plan = _plan(
        """
        name: sim_map
        version: "1"
        steps:
          - id: each
            type: map
            items: "{{ inputs.items }}"
            max_concurrency: 2
            step: {type: python, function: sim.work, input: {x: "{{ item }}"}}
        output: "{{ steps.each.output }}"
        """
    )
    ends = {f"each[{i}]": StepEnd("succeeded", 1) for i in range(len(items))}
    ends["each"] = StepEnd("succeeded")
    return Workload(
        "map", run_id, plan, {"items": items}, "succeeded", [i + 1 for i in items], steps=ends
    )


def switch(rng: random.Random, run_id: str) -> Workload:
    score = rng.randrange(10)
    plan = _plan(
        """
        name: sim_switch
        version: "1"
        steps:
          - id: route
            type: switch
            cases:
              - {when: "{{ inputs.score >= 5 }}", next: [high]}
            default: [low]
          - {id: high, type: python, function: sim.work, input: {x: 100}}
          - {id: low, type: python, function: sim.work, input: {x: 0}}
          - {id: merge, type: noop, depends_on: [high, low], input: {v: 1}}
        output: "{{ default(steps.high.output, steps.low.output) }}"
        """
    )
    high = score >= 5
    ends = {
        "high": StepEnd("succeeded" if high else "skipped", 1 if high else 0),
        "low": StepEnd("skipped" if high else "succeeded", 0 if high else 1),
        "merge": StepEnd("succeeded"),
    }
    return Workload(
        "switch", run_id, plan, {"score": score}, "succeeded", 101 if high else 1, steps=ends
    )


def retries(rng: random.Random, run_id: str) -> Workload:
    attempts = rng.randrange(1, 4)
    fail_until = rng.randrange(0, 4)
    plan = _plan(
        f"""
        name: sim_retry_{attempts}
        version: "1"
        steps:
          - id: call
            type: python
            function: sim.flaky
            input: {{fail_until: "{{{{ inputs.fail_until }}}}"}}
            retry: {{max_attempts: {attempts}, backoff: fixed, initial_delay: 2s}}
        output: "{{{{ steps.call.output }}}}"
        """
    )
    ok = fail_until < attempts
    ends = {
        "call": StepEnd(
            "succeeded" if ok else "failed",
            fail_until + 1 if ok else attempts,
            None if ok else "ConnectionError",
        )
    }
    return Workload(
        "retries",
        run_id,
        plan,
        {"fail_until": fail_until},
        "succeeded" if ok else "failed",
        f"ok after {fail_until + 1}" if ok else None,
        check_output=ok,
        steps=ends,
        max_attempts={"call": attempts},
    )


def timeout(rng: random.Random, run_id: str) -> Workload:
    plan = _plan(
        """
        name: sim_timeout
        version: "1"
        steps:
          - id: stuck
            type: python
            function: sim.hang
            timeout: 5s
            retry: {max_attempts: 2, backoff: fixed, initial_delay: 1s, retry_on: [TimeoutError]}
            on_error: continue
          - {id: after, type: noop, depends_on: [stuck], input: {done: true}}
        output: "{{ steps.after.output }}"
        """
    )
    ends = {"stuck": StepEnd("failed", 2, "TimeoutError"), "after": StepEnd("succeeded")}
    return Workload(
        "timeout",
        run_id,
        plan,
        {},
        "succeeded",
        {"done": True},
        steps=ends,
        max_attempts={"stuck": 2},
    )


SAGA_TEXT = """
    name: sim_saga
    version: "1"
    on_failure: compensate
    steps:
      - id: s1
        type: python
        function: sim.work
        input: {x: 1}
        compensate: {type: python, function: sim.undo, input: {name: s1}}
      - id: s2
        type: python
        function: sim.work
        input: {x: 2}
        depends_on: [s1]
        compensate: {type: python, function: sim.undo, input: {name: s2}}
      - id: s3
        type: python
        function: sim.work
        input: {x: 3}
        depends_on: [s2]
        compensate: {type: python, function: sim.undo, input: {name: s3}}
      - {id: boom, type: python, function: sim.flaky, input: {fail_until: 99}, depends_on: [s3]}
    """


def saga(rng: random.Random, run_id: str) -> Workload:
    plan = _plan(SAGA_TEXT)
    ends = {k: StepEnd("succeeded", 1) for k in ("s1", "s2", "s3")}
    ends["boom"] = StepEnd("failed", 1, "ConnectionError")
    return Workload(
        "saga",
        run_id,
        plan,
        {},
        "compensated",
        check_output=False,
        steps=ends,
        compensations=["s3", "s2", "s1"],
    )


def child(rng: random.Random, run_id: str) -> Workload:
    x = rng.randrange(100)
    plan = _plan(
        """
        name: sim_parent
        version: "1"
        steps:
          - {id: sub, type: subflow, workflow: sim_child, input: {x: "{{ inputs.x }}"}}
          - {id: last, type: python, function: sim.work, input: {x: "{{ steps.sub.output }}"},
             depends_on: [sub]}
        output: "{{ steps.last.output }}"
        """
    )
    ends = {"sub": StepEnd("succeeded"), "last": StepEnd("succeeded", 1)}
    return Workload(
        "child", run_id, plan, {"x": x}, "succeeded", x + 3, steps=ends, children=[f"{run_id}.sub"]
    )


def sleep(rng: random.Random, run_id: str) -> Workload:
    plan = _plan(
        """
        name: sim_sleep
        version: "1"
        steps:
          - {id: nap, type: sleep, duration: 1h}
          - {id: after, type: python, function: sim.work, input: {x: 0}, depends_on: [nap]}
        output: "{{ steps.after.output }}"
        """
    )
    ends = {"nap": StepEnd("succeeded"), "after": StepEnd("succeeded", 1)}
    return Workload("sleep", run_id, plan, {}, "succeeded", 1, steps=ends)


def signal(rng: random.Random, run_id: str) -> Workload:
    plan = _plan(
        """
        name: sim_signal
        version: "1"
        steps:
          - {id: before, type: python, function: sim.work, input: {x: 0}}
          - {id: gate, type: wait, signal: go, timeout: 1d, depends_on: [before]}
        output: "{{ steps.gate.output }}"
        """
    )
    payload = {"n": rng.randrange(1000)}
    ends = {"before": StepEnd("succeeded", 1), "gate": StepEnd("succeeded")}
    return Workload(
        "signal",
        run_id,
        plan,
        {},
        "succeeded",
        payload,
        steps=ends,
        signal=(rng.uniform(0.0, 120.0), "go", payload),
    )


def cancel(rng: random.Random, run_id: str) -> Workload:
    plan = _plan(
        """
        name: sim_cancel
        version: "1"
        on_failure: compensate
        steps:
          - id: s1
            type: python
            function: sim.work
            input: {x: 1}
            compensate: {type: python, function: sim.undo, input: {name: s1}}
          - {id: gate, type: wait, signal: never, depends_on: [s1]}
        """
    )
    return Workload(
        "cancel",
        run_id,
        plan,
        {},
        "cancelled",
        check_output=False,
        cancel_at=rng.uniform(0.0, 30.0),
    )


BUILDS: dict[str, Build] = {
    "chain": chain,
    "fan": fan,
    "map": mapped,
    "switch": switch,
    "retries": retries,
    "timeout": timeout,
    "saga": saga,
    "child": child,
    "sleep": sleep,
    "signal": signal,
    "cancel": cancel,
}
