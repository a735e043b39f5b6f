"""The protocols that compiled expressions and templates satisfy.

The model only names these shapes; ``tideflow.dsl.expr`` builds them. Keeping the
protocol here lets the pure core evaluate expressions without importing the DSL.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class Expression(Protocol):
    """A compiled expression: evaluates against a scope mapping of names to values."""

    source: str

    def evaluate(self, scope: Mapping[str, Any]) -> Any: ...

    def step_references(self) -> frozenset[str]:
        """The step ids this expression reads through ``steps.<id>``."""
        ...

    def input_references(self) -> frozenset[str]:
        """The top-level keys of ``inputs`` this expression reads."""
        ...

    def secret_references(self) -> frozenset[str]:
        """The names this expression reads through ``secrets.<NAME>``."""
        ...


class Template(Protocol):
    """A compiled value: any JSON value whose strings may contain ``{{ expr }}``."""

    def render(self, scope: Mapping[str, Any]) -> Any: ...

    def step_references(self) -> frozenset[str]: ...

    def input_references(self) -> frozenset[str]: ...

    def secret_references(self) -> frozenset[str]: ...

    @property
    def is_constant(self) -> bool: ...
