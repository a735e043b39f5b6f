"""tideflow.dsl: YAML/JSON (or the Python builder) -> a validated, immutable `Plan`."""

from tideflow.dsl.builder import Steps, Workflow
from tideflow.dsl.compiler import compile_definition, load_plan, validate
from tideflow.dsl.durations import parse_duration
from tideflow.dsl.graph import to_dot, to_mermaid
from tideflow.dsl.inputs import validate_input

__all__ = [
    "Steps",
    "Workflow",
    "compile_definition",
    "load_plan",
    "parse_duration",
    "to_dot",
    "to_mermaid",
    "validate",
    "validate_input",
]
