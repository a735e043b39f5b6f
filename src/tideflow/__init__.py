"""tideflow: a durable, event-driven workflow engine for Python.

The public API is the names below; everything else is reachable from its
subpackage but may change between minor versions.
"""

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
