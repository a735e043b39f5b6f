"""tideflow.worker.executors: what runs an action step.

Names are imported lazily so that a light module (such as the child process of
``isolation: process``) does not pay for httpx or jsonschema.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tideflow.worker.executors.base import Executor, StepContext
    from tideflow.worker.executors.errorinfo import error_info_from_exception
    from tideflow.worker.executors.http import HttpExecutor
    from tideflow.worker.executors.noop import NoopExecutor
    from tideflow.worker.executors.python import PythonExecutor, register
    from tideflow.worker.executors.registry import ExecutorRegistry
    from tideflow.worker.executors.shell import ShellExecutor

__all__ = [
    "Executor",
    "ExecutorRegistry",
    "HttpExecutor",
    "NoopExecutor",
    "PythonExecutor",
    "ShellExecutor",
    "StepContext",
    "error_info_from_exception",
    "register",
]

_HOMES = {
    "Executor": "base",
    "StepContext": "base",
    "error_info_from_exception": "errorinfo",
    "HttpExecutor": "http",
    "NoopExecutor": "noop",
    "PythonExecutor": "python",
    "register": "python",
    "ExecutorRegistry": "registry",
    "ShellExecutor": "shell",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
