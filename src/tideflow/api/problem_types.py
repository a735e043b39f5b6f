"""The problem type and status of each tideflow error (RFC 9457, api/problems.py): the one
table the API answers by and ``tideflow.remote_http`` reads back. No HTTP framework here,
so a client without the ``api`` extra can import it."""

from __future__ import annotations

from collections.abc import Mapping

from tideflow import errors
from tideflow.errors import TideflowError

__all__ = ["ERRORS", "TYPE_PREFIX"]

TYPE_PREFIX = "urn:tideflow:problem:"

ERRORS: Mapping[type[TideflowError], tuple[int, str]] = {
    # the caller's request is wrong
    errors.DefinitionError: (422, "definition-invalid"),
    errors.DefinitionUnreadable: (422, "definition-invalid"),
    errors.ExpressionError: (422, "definition-invalid"),
    errors.InputValidationError: (422, "input-invalid"),
    # a signal name no `wait` of the run's plan declares: wrong for this run whatever
    # state it is in, so a request error, not a state conflict
    errors.UnknownSignal: (422, "unknown-signal"),
    errors.BadCursor: (422, "bad-cursor"),
    errors.UnstorableData: (422, "unstorable-data"),
    errors.NotFound: (404, "not-found"),
    # credentials: every way a token can fail is one 401 (which way is for the log: telling
    # a caller that an id exists helps an attacker); a role short of the action is 403
    errors.Unauthenticated: (401, "unauthenticated"),
    errors.MissingToken: (401, "unauthenticated"),
    errors.MalformedToken: (401, "unauthenticated"),
    errors.UnknownToken: (401, "unauthenticated"),
    errors.RevokedToken: (401, "unauthenticated"),
    errors.WrongSecret: (401, "unauthenticated"),
    errors.Forbidden: (403, "forbidden"),
    # the caller holds as many event streams as it may: 429 with Retry-After
    errors.TooManyStreams: (429, "too-many-streams"),
    # the request conflicts with what is stored
    errors.DefinitionConflict: (409, "definition-conflict"),
    errors.DefinitionInactive: (409, "definition-inactive"),
    errors.RunExists: (409, "run-exists"),
    errors.RunNotRetryable: (409, "run-not-retryable"),
    errors.IllegalTransition: (409, "illegal-transition"),
    errors.ConcurrencyConflict: (409, "concurrency-conflict"),
    # the service cannot do it now; the same request may succeed later
    errors.EngineUnreachable: (503, "engine-unreachable"),
    errors.EngineAlreadyRunning: (503, "engine-busy"),
    errors.RuntimeNotStarted: (503, "engine-not-started"),
    errors.CompilerUnavailable: (503, "compiler-unavailable"),
    errors.StoreUnavailable: (503, "store-unavailable"),
    errors.StoreError: (503, "store-unavailable"),
    errors.BusError: (503, "bus-unavailable"),
    # raised by a client of the API (remote_http.py), never by a route
    errors.ServerUnreachable: (503, "server-unreachable"),
    errors.RemoteProblem: (500, "internal"),
    # faults of the service: a generic 500, the exception logged
    errors.TideflowError: (500, "internal"),
    errors.EngineError: (500, "internal"),
    errors.StateFormatError: (500, "internal"),
    # raised inside steps and recorded in the run: never out of a client call
    errors.StepError: (500, "internal"),
    errors.ExpressionEvaluationError: (500, "internal"),
    errors.StepTimeout: (500, "internal"),
    errors.ExecutorNotFound: (500, "internal"),
    errors.OutputNotSerializable: (500, "internal"),
    errors.OutputTooLarge: (500, "internal"),
    errors.DurableStartUnavailable: (500, "internal"),
    errors.ExecutorError: (500, "internal"),
}
"""Status and problem type of each tideflow error class; a subclass not listed takes its
nearest listed base's row."""
