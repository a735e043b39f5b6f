"""The one exception tree of tideflow.

::

    TideflowError
    ├── DefinitionError            a definition cannot be loaded or compiled
    │   ├── DefinitionUnreadable   not readable, not UTF-8 text, or too large
    │   └── ExpressionError        an expression or template does not parse
    ├── InputValidationError       run input does not fit the definition's `input` schema
    ├── IllegalTransition          a state change that the transition table forbids
    ├── NotFound                   an unknown run, definition or step
    ├── RunNotRetryable            a retry of a run that is not failed or timed out
    ├── DefinitionConflict         (name, version) already registered with other content
    ├── DefinitionInactive         the version asked for is deactivated: it starts no run
    ├── RunExists                  a start with a run id that a stored run has already
    ├── RuntimeNotStarted          a Runtime used before ``start()`` / ``async with``
    ├── EngineError                a run's event could not be applied or stored: the run failed
    ├── EngineAlreadyRunning       another live engine holds the store's lease
    ├── EngineUnreachable          no engine applied a client's event in time (cluster mode)
    ├── CompilerUnavailable        no compiler process of the API could take a definition now
    ├── UnknownSignal              a signal no wait step of the run's workflow waits for
    ├── StateFormatError           a stored run state or event cannot be read
    ├── BadCursor                  a pagination cursor this store did not hand out
    ├── StoreError                 the store cannot be used (damaged, unreachable, wrong schema)
    │   ├── StoreUnavailable       unreachable or busy right now: the same write may succeed later
    │   ├── UnstorableData         a value the store cannot hold: writing it again fails again
    │   └── ConcurrencyConflict    another applier advanced the run first: reload and apply again
    ├── BusError                   a bus option, URL or partition claim is wrong, or the bus is down
    ├── Unauthenticated            a request's credentials name no live API token (HTTP 401)
    │   ├── MissingToken           no credentials at all
    │   ├── MalformedToken         not ``Bearer tf_<id>_<secret>``
    │   ├── UnknownToken           no token has the id
    │   ├── RevokedToken           the token was revoked
    │   └── WrongSecret            the id is a token's, the secret is not its secret
    ├── Forbidden                  the token's role does not allow the action (HTTP 403)
    ├── TooManyStreams             a token (or the server) has as many event streams open as it may
    ├── ServerUnreachable          an HttpClient got no answer from the server's URL
    ├── RemoteProblem              a server's problem that names no tideflow error
    └── StepError                  raised *inside* a step; recorded in the run, not thrown out
        ├── ExpressionEvaluationError   an expression failed at run time
        ├── StepTimeout                 an attempt exceeded its `timeout` (type name `TimeoutError`)
        ├── ExecutorNotFound            a step type with no registered executor
        ├── OutputNotSerializable       a value a step produced cannot be stored as JSON
        ├── OutputTooLarge              a step's output is over the configured limit
        ├── DurableStartUnavailable     a worker with no store met an `idempotent: false` step
        └── ExecutorError               an executor failed (its `type` names the error class);
                                        the built-in executors' subclasses are drawn in
                                        ``tideflow.worker.executors.errors``

Every class has a docstring that serves as its default message. Errors that
happen inside a run are recorded in the run's history as ``{type, message}``
rather than raised to the caller of the runtime.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class TideflowError(Exception):
    """A tideflow error."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Diagnostic:
    """One problem found in a definition, with where it is and what to change."""

    message: str
    file: str | None = None
    line: int | None = None
    column: int | None = None
    step_id: str | None = None
    path: str | None = None
    hint: str | None = None
    severity: str = "error"

    def format(self) -> str:
        where = self.file or "<definition>"
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        text = f"{where}: {self.severity}: {self.message}"
        if self.step_id:
            text += f" (step '{self.step_id}')"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "severity": self.severity,
            "message": self.message,
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "step_id": self.step_id,
            "path": self.path,
            "hint": self.hint,
        }


class DefinitionError(TideflowError):
    """The workflow definition is invalid."""

    def __init__(self, diagnostics: list[Diagnostic] | str) -> None:
        if isinstance(diagnostics, str):
            diagnostics = [Diagnostic(message=diagnostics)]
        self.diagnostics = diagnostics
        super().__init__("\n".join(d.format() for d in diagnostics))


class DefinitionUnreadable(DefinitionError):
    """The definition cannot be loaded: unreadable, not UTF-8 text, or too large."""


class ExpressionError(DefinitionError):
    """An expression or template does not parse."""


class InputValidationError(TideflowError):
    """The run input does not match the definition's input schema."""

    def __init__(
        self, message: str | None = None, *, fields: Sequence[tuple[str, str]] = ()
    ) -> None:
        super().__init__(message)
        self.fields = tuple(fields)
        """``(JSON path in the input, what is wrong there)`` for each schema error."""


class IllegalTransition(TideflowError):
    """A state transition that the transition table does not allow."""


class NotFound(TideflowError):
    """The requested object does not exist."""


class RunNotRetryable(TideflowError):
    """Only a failed or timed-out run can be retried."""


class DefinitionConflict(TideflowError):
    """A definition with this name and version is already registered with other content."""


class DefinitionInactive(TideflowError):
    """The definition version asked for is deactivated: it starts no new run."""


class RunExists(TideflowError):
    """A run with this id is stored already: give the new run another id, or none (a
    fresh one is made), or an idempotency key to start it only once."""


class CompilerUnavailable(TideflowError):
    """No definition compiler process of the server could take the definition now (all
    busy, or one stopped): try again shortly."""


class UnknownSignal(TideflowError):
    """No wait step of the run's workflow waits for a signal of this name."""


class StepError(TideflowError):
    """A step failed.

    ``type`` is the name the retry policy's ``retry_on`` matches against;
    ``retryable`` False means the retry policy is not consulted at all.
    """

    type_name: str = "StepError"
    retryable: bool = True

    def __init__(
        self,
        message: str | None = None,
        *,
        type_name: str | None = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message)
        if type_name is not None:
            self.type_name = type_name
        if retryable is not None:
            self.retryable = retryable


class ExpressionEvaluationError(StepError):
    """An expression could not be evaluated."""

    type_name = "ExpressionError"
    retryable = False


class StepTimeout(StepError):
    """The step attempt exceeded its timeout."""

    type_name = "TimeoutError"


class ExecutorNotFound(StepError):
    """No executor is registered for this step type."""

    type_name = "ExecutorNotFound"
    retryable = False


class ExecutorError(StepError):
    """The executor reported an error."""

    type_name = "ExecutorError"


class OutputNotSerializable(StepError):
    """The step's output cannot be stored as JSON."""

    type_name = "OutputNotSerializable"
    retryable = False


class OutputTooLarge(StepError):
    """The step's output is larger than the configured limit."""

    type_name = "OutputTooLarge"
    retryable = False


class RuntimeNotStarted(TideflowError):
    """Runtime not started: use `async with Runtime(...)` or `await rt.start()`."""


class EngineError(TideflowError):
    """The engine could not apply or store an event of this run, so the run was failed."""


class StateFormatError(TideflowError):
    """A stored run state cannot be read."""


class BadCursor(TideflowError):
    """The pagination cursor is not one this store handed out."""


class StoreError(TideflowError):
    """The store cannot be used (damaged file, unreachable server, wrong schema)."""


class StoreUnavailable(StoreError):
    """The store cannot be reached or is busy right now; the same write may succeed later."""


class UnstorableData(StoreError):
    """The store cannot hold a value of this batch; writing it again would fail again."""


class ConcurrencyConflict(StoreError):
    """Another applier advanced one of these runs first; reload them and apply again."""


class BusError(TideflowError):
    """The bus refused a request (a bad option, a partition held elsewhere) or is not available."""


class Unauthenticated(TideflowError):
    """The request carries no valid API token."""


class MissingToken(Unauthenticated):
    """No API token: send the header `Authorization: Bearer tf_<id>_<secret>`."""


class MalformedToken(Unauthenticated):
    """The credentials are not `Bearer tf_<id>_<secret>`, as `tideflow tokens create`
    prints them."""


class UnknownToken(Unauthenticated):
    """No API token has this id."""


class RevokedToken(Unauthenticated):
    """The API token was revoked: create another with `tideflow tokens create`."""


class WrongSecret(Unauthenticated):
    """The API token's secret does not match."""


class Forbidden(TideflowError):
    """The API token's role does not allow this action."""


class TooManyStreams(TideflowError):
    """As many event streams are open as may be, for this API token or on the server
    (HTTP 429): close one, or try again after ``retry_after`` seconds."""

    def __init__(self, message: str | None = None, *, retry_after: int = 5) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class EngineAlreadyRunning(TideflowError):
    """Another engine holds this store's lease: only one engine may advance its runs."""


class EngineUnreachable(TideflowError):
    """No engine applied the event in time: is a `tideflow server` running on this store
    and bus?"""


class DurableStartUnavailable(StepError):
    """This worker cannot record the start of an `idempotent: false` step before running
    it: start `tideflow worker` with --store URL (the cluster's store)."""

    type_name = "DurableStartUnavailable"
    retryable = False


class ServerUnreachable(TideflowError):
    """The tideflow server cannot be reached: is `tideflow server` running at that URL?"""


class RemoteProblem(TideflowError):
    """The server answered with a problem that names no tideflow error (a request of the
    wrong shape, a body too large, a wrong method): ``status``, ``type``, ``problem``."""

    def __init__(
        self,
        message: str | None = None,
        status: int = 500,
        type: str = "",
        problem: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type
        self.problem = dict(problem or {})
