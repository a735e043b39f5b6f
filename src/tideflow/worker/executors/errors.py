"""Errors raised by the built-in executors, named so that `retry_on` can match them.

::

    tideflow.errors.ExecutorError
    ├── InvalidStepConfig        the step's config does not fit the executor   (not retryable)
    ├── InvalidStepInput         the step's input does not fit the executor    (not retryable)
    ├── ExecutorPluginError      an executor plugin failed to load             (not retryable)
    ├── SecretNotFound           a referenced secret has no value              (not retryable)
    ├── HttpError                an HTTP response that is not a success
    │   ├── HttpServerError          5xx                                    (retryable)
    │   ├── HttpRateLimited          429, carries ``retry_after``            (retryable)
    │   ├── HttpClientError          other 4xx                              (not retryable)
    │   └── HttpUnexpectedStatus     a non-error status not in expect_status (not retryable)
    ├── HttpResponseTooLarge     body larger than max_response_bytes           (not retryable)
    ├── NetworkError             connect/read/write failed                     (retryable)
    ├── WebhookDeliveryError     an outgoing event sink refused the event      (per status)
    ├── ShellCommandFailed       non-zero exit status                          (retryable)
    ├── ShellCommandNotFound     the program is not found or not executable    (not retryable)
    ├── FunctionNotFound         a python function cannot be imported          (not retryable)
    ├── FunctionRaised           an isolated python function raised (type = its class)
    └── IsolatedProcessDied      an isolated python process died without a result (retryable)

Time-outs are ``tideflow.errors.StepTimeout`` (type name ``TimeoutError``); an output
that cannot be stored is ``tideflow.errors.OutputNotSerializable`` (re-exported here).
Every class's ``type_name`` is its class name unless stated otherwise.
"""

from __future__ import annotations

from tideflow.errors import ExecutorError
from tideflow.errors import OutputNotSerializable as OutputNotSerializable  # moved; still here

BODY_SNIPPET_CHARS = 500


class InvalidStepConfig(ExecutorError):
    """The step's config is not valid for its executor."""

    type_name = "InvalidStepConfig"
    retryable = False


class InvalidStepInput(ExecutorError):
    """The step's input is not valid for its executor."""

    type_name = "InvalidStepInput"
    retryable = False


class ExecutorPluginError(ExecutorError):
    """An executor plugin could not be loaded."""

    type_name = "ExecutorPluginError"
    retryable = False


class SecretNotFound(ExecutorError):
    """A secret referenced by the step has no value."""

    type_name = "SecretNotFound"
    retryable = False


class HttpError(ExecutorError):
    """An HTTP call did not succeed."""

    type_name = "HttpError"

    def __init__(
        self, *, method: str, url: str, status: int, body: str = "", reason: str | None = None
    ) -> None:
        self.method = method
        self.url = url
        self.status = status
        self.body_snippet = snippet(body)
        text = f"{method} {url} returned HTTP {status}"
        if reason:
            text += f" ({reason})"
        if self.body_snippet:
            text += f": {self.body_snippet}"
        super().__init__(text)


class HttpServerError(HttpError):
    """The server answered with a 5xx status."""

    type_name = "HttpServerError"
    retryable = True


class HttpRateLimited(HttpError):
    """The server answered 429 Too Many Requests."""

    type_name = "HttpRateLimited"
    retryable = True

    def __init__(
        self,
        *,
        method: str,
        url: str,
        status: int = 429,
        body: str = "",
        retry_after: float | None = None,
    ) -> None:
        self.retry_after = retry_after
        reason = None if retry_after is None else f"retry after {retry_after:g}s"
        super().__init__(method=method, url=url, status=status, body=body, reason=reason)


class HttpClientError(HttpError):
    """The server answered with a 4xx status (other than 429)."""

    type_name = "HttpClientError"
    retryable = False


class HttpUnexpectedStatus(HttpError):
    """The status is not an error but is not one of the step's `expect_status`."""

    type_name = "HttpUnexpectedStatus"
    retryable = False


class HttpResponseTooLarge(ExecutorError):
    """The response body is larger than `max_response_bytes`."""

    type_name = "HttpResponseTooLarge"
    retryable = False


class NetworkError(ExecutorError):
    """A network error: the connection could not be made or was broken."""

    type_name = "NetworkError"
    retryable = True


class WebhookDeliveryError(ExecutorError):
    """An outgoing event sink did not accept the event."""

    type_name = "WebhookDeliveryError"


class ShellCommandFailed(ExecutorError):
    """The command exited with a non-zero status."""

    type_name = "ShellCommandFailed"
    retryable = True

    def __init__(self, message: str, *, exit_code: int, stdout: str, stderr: str) -> None:
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr
        super().__init__(message)


class ShellCommandNotFound(ExecutorError):
    """The command's program does not exist or is not executable."""

    type_name = "ShellCommandNotFound"
    retryable = False


class FunctionNotFound(ExecutorError):
    """The python function cannot be imported or found."""

    type_name = "FunctionNotFound"
    retryable = False
    details: str | None = None
    """The traceback of the failed import, when importing raised."""


class FunctionRaised(ExecutorError):
    """A python function running in an isolated process raised an exception.

    ``type_name`` is the class name of the original exception, ``classes`` the names
    of its base classes, ``details`` its (trimmed) traceback.
    """

    def __init__(
        self,
        message: str,
        *,
        type_name: str,
        retryable: bool,
        classes: tuple[str, ...] = (),
        details: str | None = None,
    ) -> None:
        super().__init__(message, type_name=type_name, retryable=retryable)
        self.classes = classes
        self.details = details


class IsolatedProcessDied(ExecutorError):
    """The isolated process running a python function died without reporting a result."""

    type_name = "IsolatedProcessDied"
    retryable = True


def snippet(text: str, limit: int = BODY_SNIPPET_CHARS) -> str:
    """At most ``limit`` characters of ``text``, marked when cut."""
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + "…"
