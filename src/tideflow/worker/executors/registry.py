"""Which executor runs which step type: built-ins, plugins and executors registered from code.

Plugins are installed packages that declare an entry point in the group
``tideflow.executors``; the entry point's name is the step type and it loads an
``Executor`` subclass (instantiated without arguments on first use) or an
``Executor`` instance. A plugin that fails to load is kept as a problem naming
its entry point: listing still works, and only using that step type fails.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from tideflow.errors import ExecutorNotFound
from tideflow.worker.executors.base import Executor
from tideflow.worker.executors.errors import ExecutorPluginError
from tideflow.worker.executors.http import HttpExecutor
from tideflow.worker.executors.noop import NoopExecutor
from tideflow.worker.executors.python import PythonExecutor
from tideflow.worker.executors.shell import ShellExecutor

ENTRY_POINT_GROUP = "tideflow.executors"
BUILTINS: tuple[type[Executor], ...] = (PythonExecutor, HttpExecutor, ShellExecutor, NoopExecutor)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutorInfo:
    """What `tideflow executors list` shows about one step type."""

    name: str
    source: str
    """``builtin``, ``code``, or ``plugin <distribution> (<entry point value>)``."""
    config_schema: Mapping[str, Any] | None
    error: str | None = None
    """Why a plugin is unusable; None when it loaded."""


@dataclass(slots=True, kw_only=True)
class _Entry:
    name: str
    source: str
    factory: type[Executor] | None = None
    instance: Executor | None = None
    error: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def schema(self) -> Mapping[str, Any] | None:
        if self.instance is not None:
            return self.instance.config_schema
        return None if self.factory is None else self.factory.config_schema

    def get(self) -> Executor:
        if self.error is not None:
            raise ExecutorPluginError(self.error)
        if self.instance is None:
            assert self.factory is not None
            self.instance = self.factory(**self.options)
        return self.instance


class ExecutorRegistry:
    """Executors by step type; each is created on first use and closed by :meth:`aclose`."""

    def __init__(
        self,
        *,
        discover: bool = True,
        options: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """``options`` holds constructor keyword arguments per built-in, e.g.
        ``{"python": {"max_workers": 8}}``; ``discover=False`` skips plugins."""
        options = options or {}
        self._entries: dict[str, _Entry] = {
            cls.name: _Entry(
                name=cls.name, source="builtin", factory=cls, options=options.get(cls.name, {})
            )
            for cls in BUILTINS
        }
        self._discover_pending = discover
        self._conflicts: dict[str, str] = {}

    def get(self, name: str) -> Executor:
        """The executor of step type ``name``; ``ExecutorNotFound`` when there is none."""
        entry = self._all().get(name)
        if entry is None:
            raise ExecutorNotFound(self._not_found(name))
        return entry.get()

    def names(self) -> list[str]:
        """Every known step type, usable or not, sorted."""
        return sorted(self._all())

    def schemas(self) -> dict[str, Mapping[str, Any]]:
        """The config schema of every usable executor (plugins that failed are left out)."""
        return {
            name: entry.schema
            for name, entry in sorted(self._all().items())
            if entry.schema is not None and entry.error is None
        }

    def describe(self) -> list[ExecutorInfo]:
        """Every step type with its origin, schema and load error, for listing."""
        return [
            ExecutorInfo(name=name, source=e.source, config_schema=e.schema, error=e.error)
            for name, e in sorted(self._all().items())
        ]

    def problems(self) -> dict[str, str]:
        """Plugins that could not be loaded or were shadowed: step type → error message."""
        broken = {name: e.error for name, e in self._all().items() if e.error is not None}
        return {**self._conflicts, **broken}

    def config_problems(self, name: str, config: Any) -> list[str]:
        """What is wrong with ``config`` for step type ``name`` (empty when it is valid)."""
        entry = self._all().get(name)
        if entry is None:
            return [self._not_found(name)]
        if entry.error is not None:
            return [entry.error]
        assert entry.schema is not None
        errors = Draft202012Validator(entry.schema).iter_errors({} if config is None else config)
        return [_describe_error(error.absolute_path, error.message) for error in errors]

    def register(
        self, executor: Executor | type[Executor], *, name: str | None = None, replace: bool = False
    ) -> None:
        """Add an executor (instance, or class created on first use) from code."""
        name = name or executor.name
        if not name:
            raise ValueError(f"executor {executor!r} has no name: set `name` or pass name=")
        if name in self._all() and not replace:
            raise ValueError(f"an executor named {name!r} is registered already (use replace=True)")
        _check_schema(executor.config_schema, name)
        entry = _entry_for(name, "code", executor)
        self._entries[name] = entry

    async def aclose(self) -> None:
        """Close every executor that was created; the first failure is raised at the end."""
        failure: BaseException | None = None
        for entry in self._entries.values():
            if entry.instance is None:
                continue
            try:
                await entry.instance.aclose()
            except Exception as exc:
                failure = failure or exc
        if failure is not None:
            raise failure

    def _all(self) -> dict[str, _Entry]:
        if self._discover_pending:
            self._discover_pending = False
            for entry in discover_plugins(entry_points(group=ENTRY_POINT_GROUP)):
                self._add_plugin(entry)
        return self._entries

    def _add_plugin(self, entry: _Entry) -> None:
        existing = self._entries.get(entry.name)
        if existing is None:
            self._entries[entry.name] = entry
        else:  # a built-in, or an earlier plugin of the same name, stays
            self._conflicts[entry.name] = (
                f"{entry.source} is ignored: step type {entry.name!r} is provided by "
                f"{existing.source}"
            )

    def _not_found(self, name: str) -> str:
        known = sorted(self._all())
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"no executor for step type {name!r}{hint}; installed: {', '.join(known)}"


def discover_plugins(points: Iterable[EntryPoint]) -> list[_Entry]:
    """One entry per entry point; a plugin that fails to load carries its error."""
    return [_load_plugin(point) for point in points]


def _load_plugin(point: EntryPoint) -> _Entry:
    dist = point.dist.name if point.dist is not None else "unknown distribution"
    source = f"plugin {dist} ({point.value})"
    where = f"executor plugin {point.name!r} (entry point '{point.name} = {point.value}' of {dist})"
    try:
        obj = point.load()
    except Exception as exc:
        return _Entry(
            name=point.name, source=source, error=f"{where} failed to load: {_exc_text(exc)}"
        )
    if not (isinstance(obj, Executor) or (isinstance(obj, type) and issubclass(obj, Executor))):
        error = f"{where} is a {type(obj).__name__}, not an Executor subclass or instance"
        return _Entry(name=point.name, source=source, error=error)
    try:
        _check_schema(obj.config_schema, point.name)
    except ValueError as exc:
        return _Entry(name=point.name, source=source, error=f"{where}: {exc}")
    return _entry_for(point.name, source, obj)


def _entry_for(name: str, source: str, executor: Executor | type[Executor]) -> _Entry:
    if isinstance(executor, Executor):
        return _Entry(name=name, source=source, instance=executor)
    return _Entry(name=name, source=source, factory=executor)


def _check_schema(schema: Any, name: str) -> None:
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise ValueError(
            f"config_schema of executor {name!r} is not a valid JSON Schema: {exc.message}"
        ) from None


def _exc_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _describe_error(path: Iterable[Any], message: str) -> str:
    where = ".".join(str(p) for p in path)
    return f"{where}: {message}" if where else message
