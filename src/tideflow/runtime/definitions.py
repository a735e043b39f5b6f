"""Turning what a caller hands the runtime into a Plan, and finding definitions by name."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tideflow.dsl.compiler import compile_definition
from tideflow.errors import DefinitionError
from tideflow.model.plan import Plan
from tideflow.model.versions import version_key
from tideflow.worker.executors.registry import ExecutorRegistry

log = logging.getLogger("tideflow.runtime")

DEFINITION_SUFFIXES = (".yaml", ".yml", ".json")


def coerce_plan(definition: Any, executors: ExecutorRegistry) -> Plan:
    """A Plan from a Plan, a Workflow builder, a mapping, YAML/JSON text or a file path."""
    if isinstance(definition, Plan):
        return definition
    action_types = executors.schemas()
    if hasattr(definition, "to_dict") and callable(definition.to_dict):
        return compile_definition(definition.to_dict(), action_types=action_types)
    if isinstance(definition, Path) or (isinstance(definition, str) and _is_path(definition)):
        path = Path(definition)
        return compile_definition(
            path.read_text(encoding="utf-8"), file=str(path), action_types=action_types
        )
    if isinstance(definition, Mapping | str):
        return compile_definition(definition, action_types=action_types)
    raise TypeError(f"cannot make a workflow definition from {type(definition).__name__}")


def _is_path(text: str) -> bool:
    return "\n" not in text and text.endswith(DEFINITION_SUFFIXES)


class DefinitionSource:
    """Definition files in a directory, found by workflow name (for `subflow` and the CLI)."""

    def __init__(self, directory: str | Path | None, executors: ExecutorRegistry) -> None:
        self._dir = Path(directory) if directory is not None else None
        self._executors = executors
        self._index: dict[tuple[str, str], Plan] | None = None

    @staticmethod
    def looks_like_path(text: str) -> bool:
        return _is_path(text)

    def find(self, name: str, version: str | None) -> Plan | None:
        index = self._load()
        matches = [
            plan
            for (n, v), plan in index.items()
            if n == name and (version is None or v == version)
        ]
        if not matches:
            return None
        return max(matches, key=lambda p: version_key(p.version))

    def _load(self) -> dict[tuple[str, str], Plan]:
        if self._index is None:
            self._index = {}
            if self._dir is not None and self._dir.is_dir():
                for path in sorted(self._dir.iterdir()):
                    if path.suffix in DEFINITION_SUFFIXES:
                        self._add(path)
        return self._index

    def _add(self, path: Path) -> None:
        assert self._index is not None
        try:
            plan = coerce_plan(path, self._executors)
        except (DefinitionError, OSError) as exc:
            log.debug("not a usable definition: %s (%s)", path, exc)
            return
        self._index[(plan.name, plan.version)] = plan
