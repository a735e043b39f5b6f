"""The retry decision: whether a failed attempt (of an action or a compensation) is
retried, and after how long; and the errors the engine records itself."""

from __future__ import annotations

import random
import zlib

from tideflow.model.events import ErrorInfo
from tideflow.model.plan import Backoff, RetryPolicy


def may_retry(policy: RetryPolicy, error: ErrorInfo, attempts: int) -> bool:
    """True when the policy allows another attempt after ``attempts`` failed ones.

    An error marked ``only_if_named`` (``StepOutcomeUnknown``) needs a ``retry_on`` that
    names it: an empty ``retry_on`` ("every retryable error") is not enough."""
    if not error.retryable or attempts >= policy.max_attempts:
        return False
    if error.only_if_named:
        return error.matches(policy.retry_on)
    return not policy.retry_on or error.matches(policy.retry_on)


def retry_delay(policy: RetryPolicy, error: ErrorInfo, attempts: int, seed: int) -> float | None:
    """How long to wait before retrying after attempt ``attempts`` failed with ``error``;
    None when the policy gives up. A ``retry_after`` the failure asked for is a floor."""
    if not may_retry(policy, error, attempts):
        return None
    delay = backoff_delay(policy, attempts, seed)
    return delay if error.retry_after is None else max(delay, error.retry_after)


def engine_error(type_: str, message: str, *, retryable: bool = False) -> ErrorInfo:
    """An error the engine itself records (a timeout, a switch with no case, an expression
    that fails): not retryable unless the caller says so."""
    return ErrorInfo(type=type_, message=message, retryable=retryable)


def backoff_delay(policy: RetryPolicy, attempts: int, seed: int) -> float:
    """Delay before attempt ``attempts + 1``.

    fixed: ``initial_delay``; linear: ``initial_delay * attempts``; exponential:
    ``initial_delay * multiplier ** (attempts - 1)``; never more than ``max_delay``.
    With jitter the delay is drawn uniformly from ``[delay / 2, delay]`` ("equal
    jitter": spreads retries out while keeping a floor), from ``seed`` so that the
    same event always yields the same delay.
    """
    n = max(attempts, 1)
    if policy.backoff is Backoff.FIXED:
        delay = policy.initial_delay
    elif policy.backoff is Backoff.LINEAR:
        delay = policy.initial_delay * n
    else:
        exponent = min(n - 1, 64)
        delay = policy.initial_delay * policy.multiplier**exponent
    if policy.max_delay is not None:
        delay = min(delay, policy.max_delay)
    if policy.jitter and delay > 0:
        delay = random.Random(seed).uniform(delay / 2, delay)
    return float(delay)


def stable_seed(*parts: str) -> int:
    """A deterministic seed for events that carry none (e.g. a timer-driven timeout)."""
    return zlib.crc32(":".join(parts).encode())
