"""Interceptors wrap every attempt a worker runs: one ExecuteInput in, one ExecuteOutput
out. They see the task, never a secret's value; one that raises fails the step, never the
worker."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from dataclasses import replace

import pytest

from tideflow.dsl import compile_definition
from tideflow.runtime.runtime import Runtime
from tideflow.worker.interceptors import ExecuteInput, ExecuteOutput, Execution
from tideflow.worker.secrets import EnvSecretProvider

FLOW = compile_definition(
    textwrap.dedent(
        """
        name: intercepted
        version: "1"
        steps:
          - {id: a, type: python, function: icpt.echo, input: {v: "{{ inputs.v }}"}}
          - {id: b, type: python, function: icpt.echo, depends_on: [a], input: {v: "{{ secrets.token }}"}}
        output: {a: "{{ steps.a.output }}", b: "{{ steps.b.output }}"}
        """
    )
)


@pytest.fixture(autouse=True)
def echo() -> Iterator[None]:
    from tideflow.worker.executors.functions import register, unregister

    register("icpt.echo")(lambda v: v)
    yield
    unregister("icpt.echo")


class Recording(Execution):
    seen: list[ExecuteInput] = []

    async def execute(self, input: ExecuteInput) -> ExecuteOutput:
        Recording.seen.append(input)
        out = await self.next.execute(input)
        if out.error is None and input.task.step_id == "a":
            return replace(out, output=f"<{out.output}>")
        return out


class Broken(Execution):
    async def execute(self, input: ExecuteInput) -> ExecuteOutput:
        if input.task.run_id == "broken":
            raise LookupError("the interceptor itself is broken")
        return await self.next.execute(input)


SECRETS = EnvSecretProvider({"TIDEFLOW_SECRET_token": "s3cr3t-value"})


async def test_an_interceptor_sees_each_attempt_and_may_change_its_output() -> None:
    Recording.seen.clear()
    async with Runtime(interceptors=[Recording], secrets=SECRETS, workers=2) as rt:
        result = await rt.run(FLOW, {"v": "x"})
    assert result.status == "succeeded"
    assert result.output == {"a": "<x>", "b": "***"}  # the secret is masked in the output
    assert [i.task.step_id for i in Recording.seen] == ["a", "b"]
    assert [i.context.attempt for i in Recording.seen] == [1, 1]
    assert "s3cr3t-value" not in repr(Recording.seen)  # outer links never see the value


async def test_an_interceptor_that_raises_fails_that_step_and_the_worker_goes_on() -> None:
    async with Runtime(interceptors=[Broken], secrets=SECRETS, workers=1) as rt:
        broken = await rt.run(FLOW, {"v": "y"}, run_id="broken")
        fine = await rt.run(FLOW, {"v": "z"}, run_id="fine")
    assert broken.status == "failed"
    assert broken.steps["a"].error is not None
    assert broken.steps["a"].error["type"] == "LookupError"
    assert fine.status == "succeeded"
