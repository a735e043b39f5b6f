"""Fixtures for worker unit tests: user modules in a temporary working directory."""

from __future__ import annotations

import importlib
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tideflow.worker.executors.base import StepContext


class ModuleDir:
    """Writes uniquely named modules into the current working directory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.names: list[str] = []

    def write(self, source: str, name: str | None = None) -> str:
        name = name or f"tfmod_{uuid.uuid4().hex[:10]}"
        (self.path / f"{name}.py").write_text(textwrap.dedent(source))
        self.names.append(name)
        return name

    def import_(self, name: str) -> ModuleType:
        if str(self.path) not in sys.path:
            sys.path.insert(0, str(self.path))
        importlib.invalidate_caches()
        return importlib.import_module(name)


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleDir]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    created = ModuleDir(tmp_path)
    yield created
    for name in created.names:
        sys.modules.pop(name, None)


def make_ctx(attempt: int = 1, timeout: float | None = 10.0) -> StepContext:
    return StepContext(
        run_id="run-1",
        step_id="step",
        step_key="step",
        attempt=attempt,
        idempotency_key="run-1:step",
        timeout=timeout,
    )
