"""The executor port: how a worker runs one attempt of an action step.

An executor is a small object with a name, a JSON Schema for its ``config`` and one
async method. The worker resolves secrets, applies the attempt timeout and turns
exceptions into recorded step errors; the executor only does the work.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tideflow.model.quick import quick_init

_NO_HEADERS: Mapping[str, str] = {}
OUTGOING_HEADERS: ContextVar[Mapping[str, str]] = ContextVar(
    "tideflow_outgoing_headers", default=_NO_HEADERS
)
"""Headers an executor adds to the requests it makes for the attempt running in this
context, unless the step sets them itself: an interceptor puts them here (the tracing one,
tideflow.observability.tracing, the attempt span's W3C ``traceparent``); empty otherwise."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class StepContext:
    """What an executor (and a python function declaring ``ctx``) knows about its step."""

    run_id: str
    step_id: str
    step_key: str
    """The step instance: ``step_id`` plus loop iteration / map index for nested steps."""
    attempt: int
    idempotency_key: str
    """Stable across retries of the same step instance: ``{run_id}:{step_key}``."""
    timeout: float | None = None
    workflow: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


class Executor(ABC):
    """Base class of executors. Subclasses set ``name`` and ``config_schema``."""

    name: ClassVar[str] = ""
    config_schema: ClassVar[Mapping[str, Any]] = {"type": "object"}
    """JSON Schema (draft 2020-12) of the step's config keys; checked by `tideflow validate`."""

    @abstractmethod
    async def execute(self, ctx: StepContext, config: Mapping[str, Any], input: Any) -> Any:
        """Run one attempt and return its JSON-serialisable output.

        Raise ``tideflow.errors.StepError`` (or a subclass) with a ``type_name`` the
        retry policy can name; any other exception is recorded with its class name.
        """

    async def aclose(self) -> None:
        """Release pooled resources (connections, processes). Called once at shutdown."""
        return  # nothing to release by default
