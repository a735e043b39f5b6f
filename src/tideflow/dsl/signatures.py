"""Whether a ``python`` step's input fits its function: ``f(**input)``, plus ``ctx``.

Used where the function itself is at hand: the builder's ``@wf.task`` (a compile
error) and ``tideflow validate --strict`` (which imports the functions). A worker
calling the function makes the same decision at run time
(`tideflow.worker.executors.functions.bind_arguments`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection
from typing import Any, NamedTuple

__all__ = ["CONTEXT_PARAMETER", "CallProblem", "call_problems", "keyword_parameters"]

CONTEXT_PARAMETER = "ctx"
"""A parameter of this name receives the step context, not an input value."""

_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


class CallProblem(NamedTuple):
    parameter: str
    message: str
    hint: str


def keyword_parameters(fn: Callable[..., Any]) -> dict[str, inspect.Parameter] | None:
    """The parameters an input key can fill (``ctx`` left out); None without a signature."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    return {
        name: param
        for name, param in signature.parameters.items()
        if param.kind in _KEYWORD and name != CONTEXT_PARAMETER
    }


def call_problems(fn: Callable[..., Any], keys: Collection[str], spec: str) -> list[CallProblem]:
    """Required parameters ``keys`` leave out, and keys ``fn`` does not take."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return []  # no signature to check (some builtins): the call decides
    params = signature.parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    problems: list[CallProblem] = []
    for name, param in params.items():
        required = param.default is inspect.Parameter.empty
        if param.kind is inspect.Parameter.POSITIONAL_ONLY and required:
            hint = f"make '{name}' a keyword parameter (input is passed as f(**input))"
            problems.append(CallProblem(name, f"{spec} has positional-only '{name}'", hint))
        elif param.kind in _KEYWORD and required and name not in {*keys, CONTEXT_PARAMETER}:
            message = f"missing required parameter '{name}' of {spec}"
            problems.append(CallProblem(name, message, f"add `{name}:` to the step's input"))
    if CONTEXT_PARAMETER in keys and CONTEXT_PARAMETER in params:
        message = f"input key '{CONTEXT_PARAMETER}' clashes with the ctx parameter of {spec}"
        problems.append(CallProblem(CONTEXT_PARAMETER, message, "rename the input key"))
    if not takes_any:
        known = {n for n, p in params.items() if p.kind in _KEYWORD}
        for key in sorted(set(keys) - known):
            names = ", ".join(sorted(known - {CONTEXT_PARAMETER})) or "none"
            message = f"input key '{key}' is not a parameter of {spec}"
            problems.append(CallProblem(key, message, f"its parameters: {names}"))
    return problems
