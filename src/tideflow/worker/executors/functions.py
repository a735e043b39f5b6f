"""Finding the function a ``python`` step calls, and calling it with the step's input.

A step names its function either by import path, ``"pkg.module:callable"`` (a
dotted qualname after the colon is allowed: ``"pkg.module:Class.method"``), or
by a name registered from code with :func:`register`. Import paths resolve
against the current working directory first, then ``sys.path``.

This module is deliberately light (no httpx, no jsonschema): an isolated child
process imports it to find the function again.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, overload

import orjson

from tideflow.model import storable
from tideflow.worker.executors.base import StepContext
from tideflow.worker.executors.errorinfo import trimmed_traceback
from tideflow.worker.executors.errors import (
    FunctionNotFound,
    InvalidStepInput,
)

F = TypeVar("F", bound=Callable[..., Any])

_registry: dict[str, Callable[..., Any]] = {}
_path_lock = threading.Lock()
_JSON_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


@overload
def register(name_or_fn: F, /) -> F: ...
@overload
def register(name_or_fn: str | None = None, /) -> Callable[[F], F]: ...
def register(name_or_fn: str | Callable[..., Any] | None = None, /) -> Any:
    """Make a function callable from a step as ``function: "<name>"``.

    Use as ``@register`` (the name is the function's ``__name__``) or
    ``@register("name")``. Registering another function under a taken name is an
    error; registering the same function again (e.g. after a reload) replaces it.
    """
    if callable(name_or_fn):
        _add(name_or_fn.__name__, name_or_fn)
        return name_or_fn

    def decorator(fn: F) -> F:
        _add(name_or_fn or fn.__name__, fn)
        return fn

    return decorator


def unregister(name: str) -> None:
    """Forget a registered name (no error when it is unknown)."""
    _registry.pop(name, None)


def registered_function(name: str) -> Callable[..., Any] | None:
    """The function registered as ``name``, if any."""
    return _registry.get(name)


def registered() -> dict[str, Callable[..., Any]]:
    """A copy of the registered names and their functions."""
    return dict(_registry)


def import_path(fn: Callable[..., Any]) -> str:
    """The ``module:qualname`` that imports ``fn`` again, e.g. in another process."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        raise FunctionNotFound(
            f"function {fn!r} cannot be imported by path (a lambda or a function defined "
            "inside another function); define it at module level"
        )
    return f"{module}:{qualname}"


def _add(name: str, fn: Callable[..., Any]) -> None:
    existing = _registry.get(name)
    if existing is not None and existing is not fn and _qualified(existing) != _qualified(fn):
        raise ValueError(
            f"python function name {name!r} is already registered for {_qualified(existing)}"
        )
    _registry[name] = fn


def _qualified(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


def resolve_function(spec: str) -> Callable[..., Any]:
    """The callable named by ``spec`` (import path or registered name)."""
    if ":" in spec:
        module_name, _, qualname = spec.partition(":")
        return _import_function(module_name.strip(), qualname.strip(), spec)
    fn = _registry.get(spec)
    if fn is not None:
        return fn
    if "." in spec:  # tolerate "pkg.module.callable"
        module_name, _, qualname = spec.rpartition(".")
        return _import_function(module_name, qualname, spec)
    known = ", ".join(sorted(_registry)) or "none"
    raise FunctionNotFound(
        f"no python function registered as {spec!r} (registered: {known}); "
        "use 'module:callable' to import one"
    )


def _import_function(module_name: str, qualname: str, spec: str) -> Callable[..., Any]:
    if not module_name or not qualname:
        raise FunctionNotFound(f"python function {spec!r} must look like 'pkg.module:callable'")
    obj: Any = _import_module(module_name, spec)
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            where = getattr(sys.modules.get(module_name), "__file__", None) or module_name
            raise FunctionNotFound(
                f"module {module_name!r} ({where}) has no attribute {qualname!r} "
                f"(function {spec!r})"
            ) from None
    if not callable(obj):
        raise FunctionNotFound(f"{spec!r} is a {type(obj).__name__}, not a callable")
    return obj  # type: ignore[no-any-return]


def _import_module(name: str, spec: str) -> Any:
    with _path_lock:
        cwd = _ensure_cwd_on_path()
    try:
        return _import_fresh(name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (name == exc.name or name.startswith(exc.name + ".")):
            raise _import_failed(name, spec, exc) from exc
        raise FunctionNotFound(
            f"cannot import module {name!r} for function {spec!r}: {exc}; searched the "
            f"current directory ({cwd}) first, then sys.path: {sys.path}"
        ) from None
    except Exception as exc:
        raise _import_failed(name, spec, exc) from exc


def _import_fresh(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        # A module written after the path's directory listing was cached is only
        # found once the import system's caches are invalidated.
        importlib.invalidate_caches()
        return importlib.import_module(name)


def _import_failed(name: str, spec: str, exc: BaseException) -> FunctionNotFound:
    error = FunctionNotFound(
        f"importing module {name!r} for function {spec!r} failed: {type(exc).__name__}: {exc}"
    )
    error.details = trimmed_traceback(exc)
    return error


def _ensure_cwd_on_path() -> str:
    """Put the current directory at the front of ``sys.path`` unless it is searched already."""
    cwd = os.getcwd()
    if cwd not in sys.path and not (sys.path and sys.path[0] == ""):
        sys.path.insert(0, cwd)
    return cwd


def keyword_arguments(input: Any) -> dict[str, Any]:
    """The step input as keyword arguments: a mapping, or None for no arguments."""
    if input is None:
        return {}
    if not isinstance(input, Mapping):
        raise InvalidStepInput(
            "a python step's input must be a mapping of keyword arguments, "
            f"got {type(input).__name__}"
        )
    bad = [key for key in input if not isinstance(key, str)]
    if bad:
        raise InvalidStepInput(f"python step input keys must be strings, got {bad!r}")
    return dict(input)


def bind_arguments(
    fn: Callable[..., Any], kwargs: dict[str, Any], ctx: StepContext, spec: str
) -> dict[str, Any]:
    """``kwargs`` plus ``ctx`` when ``fn`` declares it; clear error when they do not fit."""
    binder = _binder(fn)
    if binder is None:
        return kwargs
    if binder.wants_ctx:
        if "ctx" in kwargs:
            raise InvalidStepInput(f"input key 'ctx' clashes with the ctx parameter of {spec!r}")
        kwargs = {**kwargs, "ctx": ctx}
    if not binder.fits(kwargs):
        try:
            binder.signature.bind(**kwargs)
        except TypeError as exc:
            raise InvalidStepInput(
                f"function {spec!r} cannot be called with input keys {sorted(kwargs)}: {exc}"
            ) from None
    return kwargs


class _Binder:
    """What ``Signature.bind(**kwargs)`` checks, precomputed once per function: which
    keyword arguments it takes and which it needs (``bind`` itself runs only to word the
    error when they do not fit)."""

    __slots__ = ("names", "required", "signature", "unbindable", "var_keyword", "wants_ctx")

    def __init__(self, signature: inspect.Signature) -> None:
        kinds = inspect.Parameter
        params = signature.parameters.values()
        self.signature = signature
        self.names = frozenset(
            p.name for p in params if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
        )
        self.required = frozenset(p.name for p in params if p.name in self.names and _needed(p))
        self.var_keyword = any(p.kind is kinds.VAR_KEYWORD for p in params)
        self.unbindable = any(p.kind is kinds.POSITIONAL_ONLY and _needed(p) for p in params)
        self.wants_ctx = "ctx" in self.names

    def fits(self, kwargs: dict[str, Any]) -> bool:
        if self.unbindable:
            return False
        keys = kwargs.keys()
        if not self.required <= keys:
            return False
        if self.var_keyword:
            return True
        return keys <= self.names


def is_async(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` makes a coroutine (remembered per function)."""
    try:
        return _is_async(fn)
    except TypeError:  # an unhashable callable object
        return inspect.iscoroutinefunction(fn)


@functools.lru_cache(maxsize=1024)
def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn)


def _needed(param: inspect.Parameter) -> bool:
    return param.default is inspect.Parameter.empty


def _binder(fn: Callable[..., Any]) -> _Binder | None:
    try:
        return _cached_binder(fn)
    except TypeError:  # an unhashable callable object
        return _make_binder(fn)


@functools.lru_cache(maxsize=1024)
def _cached_binder(fn: Callable[..., Any]) -> _Binder | None:
    return _make_binder(fn)


def _make_binder(fn: Callable[..., Any]) -> _Binder | None:
    try:
        return _Binder(inspect.signature(fn))
    except (TypeError, ValueError):
        return None  # some builtins have no signature: let the call itself decide


def dump_output(value: Any, spec: str) -> bytes:
    """``value`` as JSON bytes, or ``OutputNotSerializable`` (see ``model.storable``)."""
    what = f"the {type(value).__name__} that function {spec!r} returned"
    return storable.encode(value, what, option=_JSON_OPTIONS)


def json_output(value: Any, spec: str) -> Any:
    """``value`` as the plain JSON data the next steps will see (tuples become lists, …)."""
    if value is None or type(value) is str or type(value) is bool:
        return value  # already plain JSON data
    return orjson.loads(dump_output(value, spec))
