"""The safe expression and template language of workflow definitions.

Definitions compute small things: a condition, a value picked from a step's
output, a URL with an id in it. They must never be able to run code, read
Python object internals, do I/O or exhaust the engine's memory, because a
definition is data that anyone with API access can register. So expressions are
parsed once into a closed set of constructs (see ``_expr_compile``), every value
is read only through ``mapping[key]`` / ``sequence[index]``, the functions are a
fixed list (``_expr_functions``), and results that would grow past a million
items are refused. The grammar is in ``docs/expressions.md``.

A template is any JSON-like value whose strings may contain ``{{ expr }}``; a
string that is exactly one template keeps the expression's type.

Compile errors raise ``ExpressionError`` with one diagnostic and an extra
attribute ``column_offset`` (0-based, into the string that was compiled) so the
DSL compiler can point at the file, line and column. Evaluation errors raise
``ExpressionEvaluationError`` (not retryable) naming the expression.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import orjson

from tideflow.dsl._expr_compile import (
    Rejected,
    compile_node,
    original_column,
    translate_go_dots,
)
from tideflow.dsl._expr_functions import EvalFailure, to_text
from tideflow.errors import Diagnostic, ExpressionError, ExpressionEvaluationError

__all__ = [
    "CompiledExpression",
    "CompiledTemplate",
    "compile_expression",
    "compile_template",
    "is_template_string",
]

Scope = Mapping[str, Any]
Path = tuple[str | int, ...]

_SECRET_NAME = re.compile("[A-Za-z_][A-Za-z0-9_]*")  # what model.secrets markers can carry
_PASS_THROUGH_CALLS = frozenset({"default", "str"})
_QUOTED = 200
MAX_LENGTH = 10_000
"""Characters of one expression (between ``{{`` and ``}}``): longer ones are refused
before Python's parser reads them."""
MAX_DEPTH = 100
"""Levels of one expression's syntax tree (``a + b + c`` is two, ``-(-x)`` two):
compiling, evaluating and printing an expression all recurse once per level."""


def is_template_string(s: str) -> bool:
    """Whether ``s`` holds at least one ``{{ expr }}`` (and so is not a plain constant)."""
    return "{{" in s


# --- compiled objects ---------------------------------------------------------------------


class References(NamedTuple):
    steps: frozenset[str]
    inputs: frozenset[str]
    secrets: frozenset[str]


_NO_REFERENCES = References(frozenset(), frozenset(), frozenset())


class CompiledExpression:
    """One expression, compiled once to closures; cheap to evaluate many times."""

    __slots__ = ("_evaluate", "_references", "_where", "source")
    source: str

    def __init__(
        self, source: str, evaluate: Callable[[Scope], Any], refs: References, normalised: str
    ) -> None:
        self.source = source
        self._evaluate = evaluate
        self._references = refs
        self._where = f" in `{normalised}`"

    def evaluate(self, scope: Scope) -> Any:
        try:
            return self._evaluate(scope)
        except EvalFailure as exc:
            raise self._failure(exc.detail) from None
        except RecursionError:
            raise self._failure("it is nested too deeply") from None

    def render_text(self, scope: Scope) -> str:
        """The value as it reads when interpolated into a string."""
        value = self.evaluate(scope)
        try:
            return to_text(value)
        except EvalFailure as exc:
            raise self._failure(exc.detail) from None

    def _failure(self, detail: str) -> ExpressionEvaluationError:
        # Details name the failing sub-expression; when that is the whole
        # expression, saying so twice only adds noise.
        detail = detail.removesuffix(self._where)
        return ExpressionEvaluationError(f"cannot evaluate `{_cut(self.source)}`: {detail}")

    def step_references(self) -> frozenset[str]:
        return self._references.steps

    def input_references(self) -> frozenset[str]:
        return self._references.inputs

    def secret_references(self) -> frozenset[str]:
        return self._references.secrets

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CompiledExpression) and other.source == self.source

    def __hash__(self) -> int:
        return hash(self.source)

    def __repr__(self) -> str:
        return f"CompiledExpression({self.source!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # A plan compiled in another process (the API's compiler pool) comes back pickled;
        # closures do not pickle, so the evaluator is rebuilt from the source on first use.
        return _unpickled_expression, (self.source, self._references, self._where)


def _unpickled_expression(source: str, refs: References, where: str) -> CompiledExpression:
    expression = CompiledExpression.__new__(CompiledExpression)
    expression.source, expression._references, expression._where = source, refs, where

    def first_use(scope: Scope) -> Any:
        expression._evaluate = _compile(source, 0, ())._evaluate
        return expression._evaluate(scope)

    expression._evaluate = first_use
    return expression


class CompiledTemplate:
    """A JSON-like value with its ``{{ }}`` expressions compiled; ``source`` is the value."""

    __slots__ = ("_expressions", "_references", "_render", "source")
    source: Any

    def __init__(
        self, source: Any, render: Callable[[Scope], Any] | None, exprs: list[CompiledExpression]
    ) -> None:
        self.source = source
        self._render = render
        self._expressions = tuple(exprs)
        self._references = (
            References(
                frozenset().union(*(e.step_references() for e in exprs)),
                frozenset().union(*(e.input_references() for e in exprs)),
                frozenset().union(*(e.secret_references() for e in exprs)),
            )
            if exprs
            else _NO_REFERENCES
        )

    def render(self, scope: Scope) -> Any:
        """The value with every template evaluated; a constant is returned as is, not copied."""
        return self.source if self._render is None else self._render(scope)

    @property
    def is_constant(self) -> bool:
        return self._render is None

    def expressions(self) -> list[CompiledExpression]:
        return list(self._expressions)

    def step_references(self) -> frozenset[str]:
        return self._references.steps

    def input_references(self) -> frozenset[str]:
        return self._references.inputs

    def secret_references(self) -> frozenset[str]:
        return self._references.secrets

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, CompiledTemplate)
            and type(other.source) is type(self.source)
            and other.source == self.source
        )

    def __hash__(self) -> int:
        return hash(self._expressions)

    def __repr__(self) -> str:
        return f"CompiledTemplate({self.source!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # as CompiledExpression's: the renderer is rebuilt from the source on first use
        return _unpickled_template, (self.source, self._render is None, self._expressions)


def _unpickled_template(
    source: Any, constant: bool, exprs: tuple[CompiledExpression, ...]
) -> CompiledTemplate:
    template = CompiledTemplate(source, None, list(exprs))
    if not constant:

        def first_use(scope: Scope) -> Any:
            render = _compile_value(source, (), [])
            assert render is not None  # it had templates when it was compiled
            template._render = render
            return render(scope)

        template._render = first_use
    return template


# --- entry points -------------------------------------------------------------------------


def compile_expression(source: str) -> CompiledExpression:
    """A bare expression (``steps.a.output > 3``) or exactly one ``"{{ expr }}"``."""
    if not isinstance(source, str):
        raise _error(
            f"expected an expression string, got {type(source).__name__} {_cut(repr(source))}",
            'quote the value, e.g. when: "{{ true }}"',
            0,
        )
    if not source.lstrip().startswith("{{"):
        try:
            return _compile(source, 0, ())
        except ExpressionError:
            if not is_template_string(source):
                raise
            raise _not_single(source) from None
    segments = _split(source, ())
    holes = [s for s in segments if isinstance(s, _Hole)]
    if len(holes) != 1 or not _is_sole(segments):
        raise _not_single(source)
    return _compile(holes[0].text, holes[0].start, ())


def _not_single(source: str) -> ExpressionError:
    return _error(
        f"expected a single expression, got text around '{{{{ }}}}' in {_cut(repr(source))}",
        "write the whole value as one '{{ expr }}' or as a bare expression",
        0,
    )


def compile_template(value: Any) -> CompiledTemplate:
    """Any JSON-like value; dict keys are literal, strings may contain ``{{ expr }}``."""
    if _plainly_constant(value):
        return CompiledTemplate(value, None, [])
    exprs: list[CompiledExpression] = []
    render = _compile_value(value, (), exprs)
    return CompiledTemplate(value, render, exprs)


def _plainly_constant(value: Any) -> bool:
    """No braces anywhere: checked on orjson's text, far faster than walking the value."""
    if isinstance(value, str):
        return "{{" not in value and "}}" not in value
    try:
        text = orjson.dumps(value)
    except TypeError:
        return False
    return b"{{" not in text and b"}}" not in text


# --- templates ----------------------------------------------------------------------------

Renderer = Callable[[Scope], Any]


class _Hole(NamedTuple):
    """One ``{{ ... }}``: ``start`` is the offset of the text after ``{{``."""

    start: int
    text: str


def _compile_value(value: Any, path: Path, exprs: list[CompiledExpression]) -> Renderer | None:
    """The renderer for ``value``, or None when it holds no template (renders to itself)."""
    if isinstance(value, str):
        # A lone '}}' is almost always a typo ("{ x }}"), so it is checked too.
        has_braces = is_template_string(value) or "}}" in value
        return _compile_string(value, path, exprs) if has_braces else None
    if isinstance(value, Mapping):
        return _compile_mapping(value, path, exprs)
    if isinstance(value, (list, tuple)):
        return _compile_list(value, path, exprs)
    return None


def _constant(value: Any) -> Renderer:
    return lambda _scope: value


def _compile_mapping(
    value: Mapping[Any, Any], path: Path, exprs: list[CompiledExpression]
) -> Renderer | None:
    parts = [(key, _compile_value(item, (*path, key), exprs), item) for key, item in value.items()]
    if all(render is None for _, render, _ in parts):
        return None
    renderers = [(key, render or _constant(item)) for key, render, item in parts]
    return lambda scope: {key: render(scope) for key, render in renderers}


def _compile_list(
    value: list[Any] | tuple[Any, ...], path: Path, exprs: list[CompiledExpression]
) -> Renderer | None:
    parts = [(_compile_value(item, (*path, i), exprs), item) for i, item in enumerate(value)]
    if all(render is None for render, _ in parts):
        return None
    renderers = [render or _constant(item) for render, item in parts]
    return lambda scope: [render(scope) for render in renderers]


def _compile_string(value: str, path: Path, exprs: list[CompiledExpression]) -> Renderer:
    segments = _split(value, path)
    compiled = [_compile(s.text, s.start, path) if isinstance(s, _Hole) else s for s in segments]
    holes = [c for c in compiled if isinstance(c, CompiledExpression)]
    exprs.extend(holes)
    if len(holes) == 1 and _is_sole(segments):
        only = holes[0]
        return lambda scope: _materialise(only.evaluate(scope))
    pieces = [
        c.render_text if isinstance(c, CompiledExpression) else _constant(c) for c in compiled if c
    ]

    def interpolate(scope: Scope) -> str:
        return "".join([piece(scope) for piece in pieces])

    return interpolate


def _materialise(value: Any) -> Any:
    """Plain dicts and lists for the engine's lazy views (``{{ steps.a }}``), so a rendered
    value is always JSON data; plain dicts and lists are returned as they are, not walked."""
    if isinstance(value, (str, dict, list)) or not isinstance(value, (Mapping, Sequence)):
        return value
    if isinstance(value, Mapping):
        return {key: _materialise(item) for key, item in value.items()}
    return [_materialise(item) for item in value]


def _is_sole(segments: list[str | _Hole]) -> bool:
    """Whether the text around the templates is only whitespace (so the type is kept)."""
    return all(isinstance(s, _Hole) or not s.strip() for s in segments)


def _split(text: str, path: Path) -> list[str | _Hole]:
    """Literal text and ``{{ }}`` holes, alternating; unbalanced braces are an error."""
    segments: list[str | _Hole] = []
    pos = 0
    while (start := text.find("{{", pos)) >= 0:
        _no_stray_close(text, pos, start, path)
        end = _closing(text, start + 2, path)
        segments += [text[pos:start], _Hole(start + 2, text[start + 2 : end])]
        pos = end + 2
    _no_stray_close(text, pos, len(text), path)
    segments.append(text[pos:])
    return segments


def _no_stray_close(text: str, start: int, end: int, path: Path) -> None:
    stray = text.find("}}", start, end)
    if stray >= 0:
        raise _error(
            f"'}}}}' without a matching '{{{{' in {_cut(repr(text))}",
            "remove it, or open the template with '{{'",
            stray,
            path,
        )


def _closing(text: str, pos: int, path: Path) -> int:
    """The offset of the ``}}`` closing a template; brackets and strings inside may hold ``}}``."""
    depth, quote, i = 0, "", pos
    while i < len(text):
        char = text[i]
        if quote:
            if char == "\\":
                i += 1
            elif char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]":
            depth = max(depth - 1, 0)
        elif char == "}":
            if depth == 0 and text.startswith("}}", i):
                return i
            depth = max(depth - 1, 0)
        i += 1
    raise _error(
        f"'{{{{' is never closed in {_cut(repr(text))}",
        "close it with '}}' (and check that every quote and bracket inside is closed)",
        pos - 2,
        path,
    )


# --- one expression -----------------------------------------------------------------------


def _compile(text: str, offset: int, path: Path) -> CompiledExpression:
    """Compiles ``text``, found at ``offset`` of the string being compiled."""
    body = text.strip()
    start = offset + len(text) - len(text.lstrip())
    if not body:
        raise _error(
            "empty expression '{{ }}'", "put an expression between the braces", offset, path
        )
    # Newlines are plain whitespace here (YAML block strings), but Python's
    # eval mode would reject them; same-length replacement keeps offsets exact.
    flat = body.replace("\r", " ").replace("\n", " ")
    translated, inserts = translate_go_dots(flat)

    def fail(message: str, hint: str, column: int) -> ExpressionError:
        column = start + original_column(column, inserts)
        return _error(f"{message} in expression `{_cut(body)}`", hint, column, path)

    if len(body) > MAX_LENGTH:
        raise fail(
            f"too long: {len(body)} characters, over the limit of {MAX_LENGTH}",
            "split the expression into steps, or pass large values as inputs",
            0,
        )
    try:
        tree = ast.parse(translated, mode="eval")
        deep = _too_deep(tree.body)
        if deep is not None:
            raise Rejected(
                f"nested too deeply: more than {MAX_DEPTH} levels",
                "split the expression into steps",
                deep,
            )
        evaluate = compile_node(tree.body)
        refs = _references(tree)
        normalised = ast.unparse(tree)
    except SyntaxError as exc:
        column = exc.offset - 1 if exc.offset else len(translated)
        reason = "invalid syntax" + ("" if exc.msg == "invalid syntax" else f" ({exc.msg})")
        raise fail(reason, "check operators, quotes and brackets", column) from None
    except Rejected as exc:
        raise fail(exc.message, exc.hint, _char_column(translated, exc.byte_offset)) from None
    except (RecursionError, MemoryError):
        # CPython's parser reports its own stack overflowing as a MemoryError (an
        # expression of 10,000 '-' or 'not'): the text is bounded, the nesting is not.
        raise fail(
            f"nested too deeply: more than {MAX_DEPTH} levels", "split the expression into steps", 0
        ) from None
    return CompiledExpression(body, evaluate, refs, normalised)


def _too_deep(root: ast.AST) -> ast.AST | None:
    """The first node more than ``MAX_DEPTH`` levels below ``root`` (contexts such as
    ``Load`` and operators not counted), found without recursing."""
    stack: list[tuple[ast.AST, int]] = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return node
        stack.extend(
            (child, depth + 1)
            for child in ast.iter_child_nodes(node)
            if isinstance(child, ast.expr | ast.keyword | ast.comprehension)
        )
    return None


def _error(message: str, hint: str, column: int, path: Path = ()) -> ExpressionError:
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
    error = ExpressionError([Diagnostic(message=message, hint=hint, path=where or None)])
    # errors.py is shared and generic; the DSL compiler reads this to add line/column.
    setattr(error, "column_offset", column)  # noqa: B010
    return error


def _cut(text: str) -> str:
    """Source quoted in a message, cut short: a message is read by people and stored."""
    return text if len(text) <= _QUOTED else text[: _QUOTED - 3] + "..."


def _char_column(text: str, byte_offset: int) -> int:
    """``ast`` offsets count UTF-8 bytes; error columns count characters (and skip blanks)."""
    column = len(text.encode()[:byte_offset].decode(errors="ignore"))
    return len(text) - len(text[column:].lstrip()) if column < len(text) else column


# --- static analysis ----------------------------------------------------------------------


def _static_key(node: ast.AST | None) -> tuple[str, str] | None:
    """``(root, key)`` for ``root.key`` and ``root['key']``, the forms analysis can see."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return node.value.id, node.attr
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, str)
    ):
        return node.value.id, node.slice.value
    return None


def _references(tree: ast.Expression) -> References:
    found: dict[str, set[str]] = {"steps": set(), "inputs": set(), "secrets": set()}
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "secrets":
            _check_secret(node, parents)
        ref = _static_key(node)
        if ref is not None and ref[0] in found:
            found[ref[0]].add(ref[1])
    return References(*(frozenset(found[k]) for k in ("steps", "inputs", "secrets")))


def _check_secret(name: ast.Name, parents: dict[ast.AST, ast.AST]) -> None:
    """Secrets may only flow into the value, never be inspected.

    The core evaluates with placeholders (``model.secrets``); the worker swaps in
    the real values for the names found statically. So ``secrets[x]`` would never
    be resolved, and ``len(secrets.K)`` or ``secrets.K == 'x'`` would silently see
    the placeholder: both are compile errors.
    """
    access = parents.get(name)
    ref = _static_key(access) if getattr(access, "value", None) is name else None
    if access is None or ref is None or not _is_secret_name(ref[1]):
        raise Rejected(
            "secrets can only be read by a literal name",
            "write secrets.NAME or secrets['NAME'] (letters, digits, '_')",
            name,
        )
    child, parent = access, parents.get(access)
    while parent is not None:
        if not _passes_through(parent, child):
            raise Rejected(
                f"secrets.{ref[1]} can only be passed into a value, "
                f"not used in '{ast.unparse(parent)}'",
                "the real secret is filled in by the worker; the engine only sees a placeholder",
                parent,
            )
        child, parent = parent, parents.get(parent)


def _is_secret_name(key: str) -> bool:
    return _SECRET_NAME.fullmatch(key) is not None


def _passes_through(parent: ast.AST, child: ast.AST) -> bool:
    """Whether ``parent`` hands ``child``'s value on unchanged (or concatenated as text)."""
    if isinstance(parent, (ast.Expression, ast.List)):
        return True
    if isinstance(parent, ast.BinOp):
        return isinstance(parent.op, ast.Add)
    if isinstance(parent, ast.Dict):
        return any(child is value for value in parent.values)
    if isinstance(parent, ast.IfExp):
        return child is not parent.test
    if isinstance(parent, ast.Call):
        return isinstance(parent.func, ast.Name) and parent.func.id in _PASS_THROUGH_CALLS
    return False
