"""The Python builder produces the same definition, hence the same plan hash, as YAML."""

import textwrap
from datetime import timedelta
from typing import Any

import pytest

from tideflow.dsl import Steps, Workflow, compile_definition
from tideflow.errors import DefinitionError

YAML = textwrap.dedent(
    """\
    name: order-fulfillment
    version: "1.2.0"
    description: Reserve, charge, ship.
    input:
      type: object
      required: [order_id, amount]
      properties: {order_id: {type: string}, amount: {type: number}, items: {type: array}}
    defaults:
      retry: {max_attempts: 3, backoff: exponential, initial_delay: 1s, max_delay: 30s}
      timeout: 30s
    timeout: 1h
    on_failure: compensate
    output: "{{ steps.ship.output }}"
    steps:
      - id: reserve
        type: python
        function: examples.orders:reserve
        input: {order_id: "{{ inputs.order_id }}"}
        compensate:
          type: python
          function: examples.orders:release
          input: {reservation: "{{ steps.reserve.output.id }}"}
      - id: route
        type: switch
        depends_on: [reserve]
        cases:
          - when: "inputs.amount > 1000"
            next: [approve]
        default: [charge]
      - id: approve
        type: wait
        signal: approval
        match: "signal.order_id == inputs.order_id"
        timeout: 2d
      - id: charge
        type: http
        url: https://pay.example.com/charge
        method: POST
        body: {amount: "{{ inputs.amount }}"}
        retry: {backoff: 5s}
      - id: pack
        type: map
        depends_on: [approve, charge]
        items: "{{ inputs.items }}"
        max_concurrency: 4
        step: {type: shell, command: [echo, "{{ item }}"]}
      - id: poll
        type: loop
        depends_on: [pack]
        max_iterations: 10
        delay: 5s
        until: steps.check.output.done
        steps:
          - {id: check, type: http, url: https://ship.example.com/status}
      - id: ship
        type: python
        depends_on: [poll]
        function: tests_builder_tasks:ship
        retry: 2
    """
)


def build() -> Workflow:
    wf = Workflow(
        "order-fulfillment",
        "1.2.0",
        description="Reserve, charge, ship.",
        input={
            "type": "object",
            "required": ["order_id", "amount"],
            "properties": {
                "order_id": {"type": "string"},
                "amount": {"type": "number"},
                "items": {"type": "array"},
            },
        },
        defaults={
            "retry": {"max_attempts": 3, "initial_delay": "1s", "max_delay": "30s"},
            "timeout": timedelta(seconds=30),
        },
        timeout="1h",
        on_failure="compensate",
        output="{{ steps.ship.output }}",
    )
    wf.python(
        "reserve",
        "examples.orders:reserve",
        input={"order_id": "{{ inputs.order_id }}"},
        compensate={
            "type": "python",
            "config": {"function": "examples.orders:release"},
            "input": {"reservation": "{{ steps.reserve.output.id }}"},
        },
    )
    wf.switch(
        "route",
        [{"when": "{{ inputs.amount > 1000 }}", "next": ["approve"]}],
        default=["charge"],
        depends_on=["reserve"],
    )
    wf.wait("approve", "approval", match="signal.order_id == inputs.order_id", timeout="P2D")
    wf.http(
        "charge",
        "https://pay.example.com/charge",
        method="POST",
        body={"amount": "{{ inputs.amount }}"},
        retry={"backoff": "5s"},
        depends_on=["route"],
    )
    wf.map(
        "pack",
        "{{ inputs.items }}",
        step={"type": "shell", "command": ("echo", "{{ item }}")},
        max_concurrency=4,
        depends_on=["charge", "approve"],
    )
    wf.loop(
        "poll",
        Steps().http("check", "https://ship.example.com/status"),
        max_iterations=10,
        delay=timedelta(seconds=5),
        until="steps.check.output.done",
        depends_on=["pack"],
    )
    wf.task("ship", depends_on=["poll"], retry={"max_attempts": 2})(ship)
    return wf


def ship(status: Any = None) -> dict[str, Any]:
    return {"status": status}


ship.__module__ = "tests_builder_tasks"


def test_builder_and_yaml_have_the_same_plan_hash() -> None:
    from_yaml = compile_definition(YAML)
    from_code = build().compile()
    assert from_code.source == from_yaml.source
    assert from_code.hash == from_yaml.hash


def test_to_dict_is_plain_definition_data() -> None:
    data = build().to_dict()
    assert data["name"] == "order-fulfillment"
    assert data["defaults"]["timeout"] == 30.0
    assert data["steps"][4]["step"] == {"type": "shell", "command": ["echo", "{{ item }}"]}
    assert data["steps"][5]["steps"] == [
        {"id": "check", "type": "http", "url": "https://ship.example.com/status"}
    ]
    assert "description" not in data["steps"][0]  # None keywords are left out


def test_steps_chain_and_generic_step() -> None:
    wf = Workflow("chain", "1")
    wf.noop("a").set("b", {"x": 1}, depends_on=["a"]).step(
        "c",
        type="switch",
        depends_on=["b"],
        cases=[{"when": "true", "next": ["d"]}],
        default="fail",
    )
    wf.sleep("d", "10m").emit("e", {"type": "done"}, depends_on=["d"])
    wf.subflow("f", "child", mode="async").shell("g", ["true"])
    plan = wf.compile()
    assert list(plan.specs) == ["a", "b", "c", "d", "e", "f", "g"]
    assert plan.specs["d"].depends_on == ("c",)


def test_loop_while_keyword() -> None:
    wf = Workflow("w", "1")
    wf.loop("again", [{"id": "x", "type": "noop"}], max_iterations=3, while_="iteration < 2")
    assert wf.to_dict()["steps"][0]["while"] == "iteration < 2"
    loop = wf.compile().specs["again"].loop
    assert loop is not None
    assert loop.while_ is not None


TASKS = Workflow("tasks", "1")


@TASKS.task(retry=3)
def first() -> int:
    return 1


def test_task_decorator_registers_a_python_step() -> None:
    assert first() == 1  # the function itself is returned unchanged
    [step] = TASKS.to_dict()["steps"]
    assert step == {"id": "first", "type": "python", "function": f"{__name__}:first", "retry": 3}


def test_task_decorator_on_module_level_function_compiles() -> None:
    wf = Workflow("tasks", "1")
    wf.task("go")(ship)
    plan = wf.compile()
    config = plan.specs["go"].config
    assert config is not None
    assert config.render({}) == {"function": "tests_builder_tasks:ship"}


def test_task_decorator_refuses_nested_functions() -> None:
    wf = Workflow("tasks", "1")

    def inner() -> None: ...

    with pytest.raises(ValueError, match="module-level function"):
        wf.task("x")(inner)


def test_map_template_from_steps() -> None:
    wf = Workflow("m", "1").map("each", [1, 2], step=Steps().noop("one"))
    assert isinstance(wf, Workflow)
    assert wf.compile().owners == {"one": "each"}
    with pytest.raises(ValueError, match="one step"):
        Workflow("m", "1").map("each", [1], step=Steps().noop("a").noop("b"))


def test_builder_errors_are_definition_errors_with_step_ids() -> None:
    wf = Workflow("bad", "1")
    wf.noop("a", depends_on=["missing"])
    with pytest.raises(DefinitionError) as info:
        wf.compile()
    [error] = info.value.diagnostics
    assert error.step_id == "a"
    assert error.path == "steps[0].depends_on[0]"
    assert error.line is None
