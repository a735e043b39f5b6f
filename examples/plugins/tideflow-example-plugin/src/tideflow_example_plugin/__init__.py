"""An example tideflow executor plugin: ``echo_upper`` upper-cases text.

With ``config.text`` the output is that text upper-cased; otherwise the output is
the step input with every string in it upper-cased.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from tideflow.worker.executors.base import Executor, StepContext

__all__ = ["UpperExecutor"]


class UpperExecutor(Executor):
    """Upper-cases ``config.text``, or every string in the step input."""

    name: ClassVar[str] = "echo_upper"
    config_schema: ClassVar[Mapping[str, Any]] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "echo_upper step config",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "text": {"type": "string", "description": "text to upper-case instead of the input"},
        },
    }

    async def execute(self, ctx: StepContext, config: Mapping[str, Any], input: Any) -> Any:
        if config and "text" in config:
            return str(config["text"]).upper()
        return _upper(input)


def _upper(value: Any) -> Any:
    if isinstance(value, str):
        return value.upper()
    if isinstance(value, Mapping):
        return {key: _upper(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_upper(item) for item in value]
    return value
