"""The protocols that compiled expressions and templates satisfy.

The model only names these shapes; ``tideflow.dsl.expr`` builds them. Keeping the
protocol here lets the pure core evaluate expressions without importing the DSL.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Protocol

DRAWS_KEY = "__draws__"
"""The reserved scope name under which the engine puts the ``Draws`` of an evaluation."""


class Draws:
    """Where ``uuid()``, ``random()`` and ``random_int()`` take their values from.

    Each value is a SHA-256 of the run id, the instance being evaluated (a step key such
    as ``fan[3]`` or ``poll@2/check``, with a suffix for config, compensation and loop
    conditions) and a counter of the draws made so far, so two calls differ and a
    replayed or resumed run computes the same values: no randomness in the core.
    """

    __slots__ = ("_count", "_instance", "_run_id")

    def __init__(self, run_id: str, instance: str) -> None:
        self._run_id = run_id
        self._instance = instance
        self._count = 0

    def next(self) -> bytes:
        """The next 32 bytes of this evaluation's stream."""
        self._count += 1
        seed = f"{self._run_id}\x1f{self._instance}\x1f{self._count}"
        return hashlib.sha256(seed.encode()).digest()


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
