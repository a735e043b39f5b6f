"""The exception trees drawn in docstrings are the real class hierarchy, and every
tideflow error class is drawn: parse each drawing and compare it with ``__mro__``."""

from __future__ import annotations

import importlib
import pkgutil
import re

import tideflow
from tideflow import errors
from tideflow.worker.executors import errors as executor_errors

DRAWINGS = (errors, executor_errors)
"""Modules whose docstring draws (part of) the tree; a drawing's names are looked up in
its module, then in ``tideflow.errors``."""

_ROW = re.compile(r"^(?P<indent>[ │├└─]*)(?P<name>[A-Za-z_][\w.]*)(?:\s|$)")


def drawn_edges(module: object) -> list[tuple[str, str | None]]:
    """(class, drawn parent) for every name in the ``::`` block of a module's docstring."""
    doc = getattr(module, "__doc__", None) or ""
    block = doc.split("::", 1)[1].split("\n\n", 2)[1]
    stack: list[tuple[int, str]] = []
    edges: list[tuple[str, str | None]] = []
    for line in block.splitlines():
        match = _ROW.match(line)
        if match is None or (not match.group("indent").strip("│ ") and stack):
            continue  # a wrapped description line, not a class
        depth = len(match.group("indent"))
        name = match.group("name").rsplit(".", 1)[-1]
        while stack and stack[-1][0] >= depth:
            stack.pop()
        edges.append((name, stack[-1][1] if stack else None))
        stack.append((depth, name))
    return edges


def _lookup(module: object, name: str) -> type:
    cls = getattr(module, name, None) or getattr(errors, name)
    assert isinstance(cls, type), name
    return cls


def test_every_drawn_class_has_the_drawn_parent() -> None:
    for module in DRAWINGS:
        edges = drawn_edges(module)
        assert len(edges) > 5, f"no tree found in {module.__name__}"
        for name, parent in edges[1:]:
            assert parent is not None
            cls = _lookup(module, name)
            assert cls.__mro__[1] is _lookup(module, parent), (
                f"{module.__name__} draws {name} under {parent}, but its base is "
                f"{cls.__mro__[1].__name__}"
            )


def _all_error_classes() -> set[type]:
    for info in pkgutil.walk_packages(tideflow.__path__, "tideflow."):
        importlib.import_module(info.name)
    found: set[type] = set()
    todo: list[type] = [errors.TideflowError]
    while todo:
        cls = todo.pop()
        if (
            cls.__module__.startswith("tideflow.")
            and not cls.__module__.startswith("tideflow.testing.")
            and not cls.__name__.startswith("_")
        ):  # tideflow.testing's faults stand in for real errors (the simulation's): not raised by tideflow
            found.add(cls)
        todo += cls.__subclasses__()
    return found


def test_every_tideflow_error_class_is_drawn_once() -> None:
    drawn = [_lookup(m, name) for m in DRAWINGS for name, _ in drawn_edges(m)]
    roots = [_lookup(m, drawn_edges(m)[0][0]) for m in DRAWINGS]
    counted = [cls for cls in drawn if cls not in roots[1:]]  # a sub-tree's root is drawn above
    assert len(counted) == len(set(counted)), "a class is drawn twice"
    missing = sorted(c.__module__ + "." + c.__qualname__ for c in _all_error_classes() - set(drawn))
    assert missing == [], f"error classes missing from the drawn trees: {missing}"


def test_every_class_in_tideflow_errors_has_a_docstring_message() -> None:
    for name, _ in drawn_edges(errors):
        cls = _lookup(errors, name)
        assert cls.__doc__ and "__doc__" in vars(cls), f"{name} has no docstring of its own"
