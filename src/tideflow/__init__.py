"""tideflow: a durable, event-driven workflow engine for Python.

The public API is the names below; everything else is reachable from its
subpackage but may change between minor versions.

The names are imported on first use (PEP 562 ``__getattr__``): ``import tideflow``
alone, or importing one of its subpackages (as the `tideflow` command does), does not
import the engine, the compiler, jsonschema or httpx.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tideflow.client import Client
    from tideflow.dsl import Workflow, compile_definition, load_plan, validate
    from tideflow.errors import DefinitionError, StepError, TideflowError
    from tideflow.model.plan import Plan
    from tideflow.model.states import RunStatus, StepStatus
    from tideflow.runtime.result import RunResult, StepResult
    from tideflow.runtime.runtime import Runtime
    from tideflow.worker.executors.base import Executor, StepContext
    from tideflow.worker.executors.functions import register

__version__ = "0.1.0"

_HOMES = {
    "Client": "tideflow.client",
    "DefinitionError": "tideflow.errors",
    "Executor": "tideflow.worker.executors.base",
    "Plan": "tideflow.model.plan",
    "RunResult": "tideflow.runtime.result",
    "RunStatus": "tideflow.model.states",
    "Runtime": "tideflow.runtime.runtime",
    "StepContext": "tideflow.worker.executors.base",
    "StepError": "tideflow.errors",
    "StepResult": "tideflow.runtime.result",
    "StepStatus": "tideflow.model.states",
    "TideflowError": "tideflow.errors",
    "Workflow": "tideflow.dsl",
    "compile_definition": "tideflow.dsl",
    "load_plan": "tideflow.dsl",
    "register": "tideflow.worker.executors.functions",
    "validate": "tideflow.dsl",
}

__all__ = [
    "Client",
    "DefinitionError",
    "Executor",
    "Plan",
    "RunResult",
    "RunStatus",
    "Runtime",
    "StepContext",
    "StepError",
    "StepResult",
    "StepStatus",
    "TideflowError",
    "Workflow",
    "__version__",
    "compile_definition",
    "load_plan",
    "register",
    "validate",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'tideflow' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next look-up is a plain global
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
