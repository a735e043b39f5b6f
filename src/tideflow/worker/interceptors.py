"""The interceptor chain around one attempt: everything a worker does besides running the
executor (secrets, redaction, the output limit, fault points, metrics, tracing).

Like temporalio's ``worker/_interceptor.py``: each link takes one input object and
returns one output object, and calls the next link to go on::

    class Timing(Execution):
        async def execute(self, input: ExecuteInput) -> ExecuteOutput:
            began = time.monotonic()
            try:
                return await self.next.execute(input)
            finally:
                observe(input.task.step_id, time.monotonic() - began)

    WorkerPool(..., interceptors=[Timing])          # an Interceptor: next link -> link

The innermost link runs the executor and turns whatever it raises into the attempt's
error (``ExecuteOutput.error``); only a cancellation (the attempt is no longer wanted)
and ``KeyboardInterrupt`` pass through. The chain is built once per pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tideflow import faults, logcontext
from tideflow.bus.base import Headers
from tideflow.errors import StepError
from tideflow.model import storable
from tideflow.model.commands import DispatchTask
from tideflow.model.events import ErrorInfo
from tideflow.model.quick import quick_init
from tideflow.worker import capture
from tideflow.worker.executors.base import StepContext
from tideflow.worker.executors.errorinfo import error_info_from_exception
from tideflow.worker.executors.registry import ExecutorRegistry
from tideflow.worker.secrets import Redactor, SecretProvider, resolve_markers

__all__ = [
    "Builtins",
    "ExecuteInput",
    "ExecuteOutput",
    "Execution",
    "Interceptor",
    "build_chain",
    "failure",
]


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class ExecuteInput:
    """One attempt: the task as dispatched, its context, and the config and input the
    executor gets (links may replace these two, e.g. with secret values filled in);
    ``headers`` are the task message's (W3C ``traceparent``: the run's span).
    ``report_headers`` are the bus headers of the events that report the attempt (its
    start, when it goes out on its own, and its outcome): empty unless a link adds to them
    (the tracing one puts the attempt span's ``traceparent`` here); the one dict of the
    attempt, kept when a link replaces the input."""

    task: DispatchTask
    context: StepContext
    config: Any
    input: Any
    headers: Headers = field(default_factory=dict)
    report_headers: dict[str, str] = field(default_factory=dict)


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class ExecuteOutput:
    """What the attempt produced: its output, or the error that fails it."""

    output: Any = None
    error: ErrorInfo | None = None


class Execution:
    """One link of the chain; the base class hands the input on unchanged."""

    def __init__(self, next: Execution) -> None:
        self.next = next

    async def execute(self, input: ExecuteInput) -> ExecuteOutput:
        return await self.next.execute(input)


Interceptor = Callable[[Execution], Execution]
"""Wraps the next link (a link class, or a factory of one)."""


def failure(exc: BaseException) -> ExecuteOutput:
    """The output of an attempt that failed with ``exc``."""
    return ExecuteOutput(error=error_info_from_exception(exc))


class RunExecutor(Execution):
    """The innermost link: the executor of the step's type. With ``max_output`` it checks
    the output as `OutputLimit` does (`Builtins`: one coroutine for both)."""

    def __init__(self, executors: ExecutorRegistry, max_output: int | None = None) -> None:
        self._executors = executors
        self._max_output = max_output

    async def execute(self, input: ExecuteInput) -> ExecuteOutput:
        return await self.run(input.task, input.context, input.config, input.input)

    async def run(
        self, task: DispatchTask, context: StepContext, config: Any, value: Any
    ) -> ExecuteOutput:
        """``execute`` without an `ExecuteInput` (`Builtins` calls it for most attempts)."""
        try:
            executor = self._executors.get(task.type)
            output = await executor.execute(context, config, value)
        except (asyncio.CancelledError, KeyboardInterrupt):
            # Ctrl-C reaches the loop here; the python executor turns one that user
            # code raises into a step error itself.
            raise
        except BaseException as exc:  # SystemExit and the like from an executor fail the step
            return failure(exc)
        if self._max_output is not None:
            return checked(task, output, self._max_output)
        return ExecuteOutput(output=output)


class FaultPoints(Execution):
    """The crash-test points around the executor (``TIDEFLOW_FAULT``, see tideflow.faults)."""

    async def execute(self, input: ExecuteInput) -> ExecuteOutput:
        faults.checkpoint("task_started")
        out = await self.next.execute(input)
        faults.checkpoint("task_finished")
        return out


class OutputLimit(Execution):
    """Fails an attempt whose output no store can hold or that is larger than the limit."""

    def __init__(self, next: Execution, max_output: int) -> None:
        super().__init__(next)
        self._max_output = max_output

    async def execute(self, input: ExecuteInput) -> ExecuteOutput:
        return self.check(input.task, await self.next.execute(input))

    def check(self, task: DispatchTask, out: ExecuteOutput) -> ExecuteOutput:
        if out.error is None:
            return checked(task, out.output, self._max_output)
        return out


def checked(task: DispatchTask, output: Any, max_output: int) -> ExecuteOutput:
    """The output of an attempt that succeeded, or its failure when no store can hold the
    output or it is larger than ``max_output``."""
    try:
        storable.check(output, f"the output of step {task.step_key!r}", max_output)
    except StepError as exc:
        return failure(exc)
    return ExecuteOutput(output=output)


class Secrets(Execution):
    """Fills in the secret values a step's templates name, and masks them in what the
    attempt produces (output and error) before anything is recorded."""

    def __init__(self, next: Execution, provider: SecretProvider) -> None:
        super().__init__(next)
        self._provider = provider

    async def execute(self, input: ExecuteInput) -> ExecuteOutput:
        names = input.task.secrets
        if not names:
            return await self.next.execute(input)
        try:
            config, used_config = resolve_markers(input.config, names, self._provider)
            value, used_input = resolve_markers(input.input, names, self._provider)
        except Exception as exc:  # SecretNotFound names where it looked, never a value
            return failure(exc)
        redactor = Redactor([*used_config, *used_input])
        written = capture.current() if redactor else None
        if written is not None:  # what the attempt prints is masked too
            written.redact_with(redactor.redact_text)
        with logcontext.with_secrets((*used_config, *used_input)):  # masked in log lines too
            out = await self.next.execute(replace(input, config=config, input=value))
        if out.error is not None:
            return ExecuteOutput(error=redactor.redact_error(out.error))
        return ExecuteOutput(output=redactor.redact(out.output))


class Builtins(Execution):
    """Secrets, the output limit and the executor as one link, when nothing comes between
    them (no fault points): an attempt without secrets, which is most of them, then costs
    one coroutine instead of three, and none of `ExecuteInput` when the pool calls `run`.
    A step with secrets goes the way of the separate links (``next``)."""

    def __init__(
        self, executors: ExecutorRegistry, provider: SecretProvider, max_output: int
    ) -> None:
        self._checked = RunExecutor(executors, max_output)
        super().__init__(Secrets(OutputLimit(RunExecutor(executors), max_output), provider))

    async def execute(self, input: ExecuteInput) -> ExecuteOutput:
        if input.task.secrets:
            return await self.next.execute(input)
        return await self.run(input.task, input.context, input.config, input.input)

    def run(
        self, task: DispatchTask, context: StepContext, config: Any, value: Any
    ) -> Coroutine[Any, Any, ExecuteOutput]:
        """The attempt of a step without secrets (``task.secrets`` empty): the executor's
        run with its output checked, awaited by the caller (no coroutine of its own)."""
        return self._checked.run(task, context, config, value)


def build_chain(
    executors: ExecutorRegistry,
    *,
    secrets: SecretProvider,
    max_output: int,
    interceptors: Sequence[Interceptor] = (),
) -> Execution:
    """The chain, outermost first: the given interceptors, secrets, the output limit, the
    fault points (only when ``TIDEFLOW_FAULT`` is set), the executor. Without fault points
    the middle three are one link (`Builtins`)."""
    link: Execution
    if faults.ARMED:
        link = Secrets(OutputLimit(FaultPoints(RunExecutor(executors)), max_output), secrets)
    else:
        link = Builtins(executors, secrets, max_output)
    for interceptor in reversed(interceptors):
        link = interceptor(link)
    return link
