"""error_info_from_exception: what the worker records for any exception."""

from __future__ import annotations

from tideflow.errors import StepError, StepTimeout
from tideflow.worker.executors.errorinfo import error_info_from_exception
from tideflow.worker.executors.errors import (
    FunctionRaised,
    HttpRateLimited,
    HttpServerError,
    ShellCommandNotFound,
)


def test_step_error_keeps_type_name_and_retryable() -> None:
    info = error_info_from_exception(ShellCommandNotFound("program 'x' not found"))
    assert (info.type, info.retryable) == ("ShellCommandNotFound", False)
    assert info.message == "program 'x' not found"
    assert info.classes[0] == "ShellCommandNotFound"
    assert "StepError" in info.classes


def test_step_timeout_is_named_timeout_error() -> None:
    info = error_info_from_exception(StepTimeout())
    assert info.type == "TimeoutError"
    assert info.message == "The step attempt exceeded its timeout."


def test_http_errors_share_a_base_name() -> None:
    info = error_info_from_exception(HttpServerError(method="GET", url="http://x", status=502))
    assert info.matches(("HttpError",))
    assert info.details is None


def test_rate_limit_carries_retry_after() -> None:
    info = error_info_from_exception(HttpRateLimited(method="GET", url="u", retry_after=2.5))
    assert info.retry_after == 2.5
    assert "retry after 2.5s" in info.message


def test_step_error_with_a_custom_type() -> None:
    info = error_info_from_exception(StepError("no stock", type_name="OutOfStock", retryable=False))
    assert (info.type, info.retryable) == ("OutOfStock", False)


def test_transported_error_declares_its_own_classes() -> None:
    error = FunctionRaised(
        "boom",
        type_name="KeyError",
        retryable=True,
        classes=("KeyError", "LookupError"),
        details="Traceback…",
    )
    info = error_info_from_exception(error)
    assert info.classes == ("KeyError", "LookupError")
    assert info.details == "Traceback…"


def test_plain_exception() -> None:
    try:
        empty: dict[str, int] = {}
        empty["missing"]
    except KeyError as exc:
        info = error_info_from_exception(exc)
    assert info.type == "KeyError"
    assert info.retryable
    assert info.classes == ("KeyError", "LookupError")
    assert info.details is not None and "KeyError" in info.details


def test_exception_without_message_or_traceback() -> None:
    info = error_info_from_exception(RuntimeError())
    assert info.message == "RuntimeError"
    assert info.details is None


def test_long_messages_are_trimmed() -> None:
    info = error_info_from_exception(ValueError("x" * 10_000))
    assert len(info.message) <= 4 * 1024 + 1
