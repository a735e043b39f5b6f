"""The workflows the crash tests run, their run ids and inputs, and what each run must end with.

Together they put a kill in every situation the durability issue names: a DAG
with parallel branches, a retried step and a join (after dispatch, mid-step,
after completion before commit); a durable ``sleep`` (waiting on a timer); a
``wait`` for a signal the driver sends (waiting on a signal); a ``map``; and a
saga whose last step fails, so that its compensations run (during compensation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FN = "crash_steps:"
SIGNAL = "go"
SIGNAL_PAYLOAD = {"bonus": 7}


def python_step(function: str, **fields: Any) -> dict[str, Any]:
    return {"type": "python", "function": FN + function, **fields}


DAG = {
    "name": "crash-dag",
    "version": "1",
    "steps": [
        {"id": "a", **python_step("add", input={"value": "{{ inputs.x }}", "amount": 1})},
        {
            "id": "b",
            "depends_on": ["a"],
            **python_step("multiply", input={"value": "{{ steps.a.output }}", "factor": 2}),
        },
        {
            "id": "c",
            "depends_on": ["a"],
            **python_step("flaky_multiply", input={"value": "{{ steps.a.output }}", "factor": 3}),
            "retry": {"max_attempts": 3, "backoff": "10ms", "retry_on": ["ConnectionError"]},
        },
        {
            "id": "d",
            "depends_on": ["b", "c"],
            **python_step("total", input={"values": "{{ [steps.b.output, steps.c.output] }}"}),
        },
    ],
    "output": "{{ steps.d.output }}",
}

TIMER = {
    "name": "crash-timer",
    "version": "1",
    "steps": [
        {"id": "a", **python_step("add", input={"value": "{{ inputs.x }}", "amount": 10})},
        {"id": "nap", "type": "sleep", "duration": "200ms", "depends_on": ["a"]},
        {
            "id": "b",
            "depends_on": ["nap"],
            **python_step("multiply", input={"value": "{{ steps.a.output }}", "factor": 2}),
        },
    ],
    "output": "{{ steps.b.output }}",
}

SIGNALLED = {
    "name": "crash-signal",
    "version": "1",
    "steps": [
        {"id": "a", **python_step("add", input={"value": "{{ inputs.x }}", "amount": 100})},
        {"id": "go", "type": "wait", "signal": SIGNAL, "depends_on": ["a"]},
        {
            "id": "b",
            "depends_on": ["go"],
            **python_step(
                "add",
                input={"value": "{{ steps.a.output }}", "amount": "{{ steps.go.output.bonus }}"},
            ),
        },
    ],
    "output": "{{ steps.b.output }}",
}

MAP = {
    "name": "crash-map",
    "version": "1",
    "steps": [
        {
            "id": "fan",
            "type": "map",
            "items": "{{ inputs.items }}",
            "max_concurrency": 2,
            "step": python_step(
                "multiply", id="fan_item", input={"value": "{{ item }}", "factor": 10}
            ),
        },
        {
            "id": "sum",
            "depends_on": ["fan"],
            **python_step("total", input={"values": "{{ steps.fan.output }}"}),
        },
    ],
    "output": "{{ steps.sum.output }}",
}

SAGA = {
    "name": "crash-saga",
    "version": "1",
    "on_failure": "compensate",
    "steps": [
        {
            "id": "r1",
            **python_step("reserve", input={"item": "one-{{ inputs.x }}"}),
            "compensate": python_step("release", input={"item": "{{ steps.r1.output.reserved }}"}),
        },
        {
            "id": "r2",
            "depends_on": ["r1"],
            **python_step("reserve", input={"item": "two-{{ inputs.x }}"}),
            "compensate": python_step("release", input={"item": "{{ steps.r2.output.reserved }}"}),
        },
        {
            "id": "boom",
            "depends_on": ["r2"],
            **python_step("reject", input={"item": "{{ inputs.x }}"}),
        },
    ],
}

DEFINITIONS = [DAG, TIMER, SIGNALLED, MAP, SAGA]


@dataclass(frozen=True, slots=True)
class PlannedRun:
    run_id: str
    workflow: str
    input: dict[str, Any]
    status: str
    """The terminal status the run must end in."""
    output: Any
    compensated: tuple[str, ...] = ()
    """Step keys whose compensation must have completed (saga runs)."""

    @property
    def idempotency_key(self) -> str:
        return f"crash-start:{self.run_id}"

    @property
    def signalled(self) -> bool:
        return self.workflow == SIGNALLED["name"]


def planned_runs(copies: int) -> list[PlannedRun]:
    """``copies`` runs of each workflow, with fixed ids, so a restarted driver starts nothing twice."""
    runs: list[PlannedRun] = []
    for i in range(copies):
        x = i + 1
        items = [x, x + 1, x + 2, x + 3]
        runs += [
            PlannedRun(f"dag-{i}", "crash-dag", {"x": x}, "succeeded", 5 * (x + 1)),
            PlannedRun(f"timer-{i}", "crash-timer", {"x": x}, "succeeded", 2 * (x + 10)),
            PlannedRun(
                f"signal-{i}",
                "crash-signal",
                {"x": x},
                "succeeded",
                x + 100 + SIGNAL_PAYLOAD["bonus"],
            ),
            PlannedRun(f"map-{i}", "crash-map", {"items": items}, "succeeded", 10 * sum(items)),
            PlannedRun(f"saga-{i}", "crash-saga", {"x": x}, "compensated", None, ("r1", "r2")),
        ]
    return runs
