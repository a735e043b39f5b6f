"""The correlation key of a `wait`'s ``match``: what lets a signal find its run among many.

A ``match`` of the form ``signal.<path> == <expression that does not read signal>`` (either
side, or one conjunct of an ``and``) says: this wait takes a signal whose value at
``<path>`` equals what the other side is for this run. The engine evaluates that side when
the wait starts and indexes the wait under (name, path, value); a signal then finds its
runs by the value at each indexed path of its payload, without looking at any other run
(runtime/correlate.py). Any other ``match`` (or none) is not indexed: such waits are found
by name, as every wait used to be. The decider still evaluates the whole ``match``.
"""

from __future__ import annotations

import ast

from tideflow.dsl._expr_compile import translate_go_dots
from tideflow.dsl.expr import compile_expression
from tideflow.errors import ExpressionError
from tideflow.model.expressions import Expression
from tideflow.model.plan import Correlation

__all__ = ["correlation_of"]


def correlation_of(match: Expression | None) -> Correlation | None:
    """The match's correlation (path in the signal, key expression), or None."""
    source = getattr(match, "source", None)
    if not isinstance(source, str):
        return None
    try:
        tree = ast.parse(translate_go_dots(source)[0].strip(), mode="eval").body
    except SyntaxError:
        return None
    for comparison in _conjuncts(tree):
        found = _equality(comparison)
        if found is not None:
            return found
    return None


def _conjuncts(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
        return [part for value in node.values for part in _conjuncts(value)]
    return [node]


def _equality(node: ast.expr) -> Correlation | None:
    if not (
        isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq)
    ):
        return None
    for side, other in ((node.left, node.comparators[0]), (node.comparators[0], node.left)):
        path = _signal_path(side)
        if path and not _reads_signal(other):
            try:
                key = compile_expression(ast.unparse(other))
            except ExpressionError:
                return None
            return Correlation(path=path, key=key)
    return None


def _signal_path(node: ast.expr) -> tuple[str, ...] | None:
    """``signal.a.b`` / ``signal["a"]["b"]`` -> ("a", "b"); None for anything else."""
    parts: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ):
            parts.append(node.slice.value)
            node = node.value
        else:
            break
    if isinstance(node, ast.Name) and node.id == "signal" and parts:
        return tuple(reversed(parts))
    return None


def _reads_signal(node: ast.expr) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "signal" for n in ast.walk(node))
