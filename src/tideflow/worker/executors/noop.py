"""The ``noop`` executor: does nothing; its output is its input."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from tideflow.model.action_schemas import NOOP_CONFIG_SCHEMA
from tideflow.worker.executors.base import Executor, StepContext


class NoopExecutor(Executor):
    """Runs ``noop`` steps."""

    name: ClassVar[str] = "noop"
    config_schema: ClassVar[Mapping[str, Any]] = NOOP_CONFIG_SCHEMA

    async def execute(self, ctx: StepContext, config: Mapping[str, Any], input: Any) -> Any:
        return input
