"""Turning what a caller hands the runtime into a Plan, and finding definitions by name.

A definition is a Plan, a `Workflow` builder, a mapping, YAML/JSON text, a YAML/JSON
file, or Python code that builds a workflow (`load_python_workflow`):

- ``flow.py`` imports the file (its directory goes on ``sys.path``, so the step
  functions it defines can be imported by workers) and takes its workflow: the
  module-level ``workflow`` if there is one, else the only `Workflow` instance
  among its globals;
- ``flow.py:name`` takes the global ``name`` instead;
- ``package.module`` and ``package.module:name`` import a module the same way.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from tideflow.dsl.builder import Workflow
from tideflow.dsl.compiler import compile_definition
from tideflow.dsl.schema_values import NAME_RE
from tideflow.errors import DefinitionError, DefinitionUnreadable, Diagnostic
from tideflow.model.plan import Plan
from tideflow.model.versions import version_key
from tideflow.worker.executors.registry import ExecutorRegistry

log = logging.getLogger("tideflow.runtime")

DEFINITION_SUFFIXES = (".yaml", ".yml", ".json")
WORKFLOW_ATTRIBUTE = "workflow"
"""The global a Python definition module's workflow is found under (when it is not the
module's only `Workflow`)."""


def coerce_plan(definition: Any, executors: ExecutorRegistry) -> Plan:
    """A Plan from a Plan, a Workflow builder, a mapping, YAML/JSON text, a file path
    (``.yaml``, ``.yml``, ``.json``) or a Python definition (``flow.py[:name]``)."""
    if isinstance(definition, Plan):
        return definition
    action_types = executors.schemas()
    if isinstance(definition, Workflow):
        return definition.compile(action_types=action_types)
    if hasattr(definition, "to_dict") and callable(definition.to_dict):
        return compile_definition(definition.to_dict(), action_types=action_types)
    if is_python_reference(definition, files_only=True):
        workflow = load_python_workflow(str(definition))
        return workflow.compile(action_types=action_types)
    if isinstance(definition, Path) or (isinstance(definition, str) and _is_path(definition)):
        return compile_definition(Path(definition), action_types=action_types)
    if isinstance(definition, Mapping | str):
        return compile_definition(definition, action_types=action_types)
    raise TypeError(f"cannot make a workflow definition from {type(definition).__name__}")


def _is_path(text: str) -> bool:
    return "\n" not in text and text.endswith(DEFINITION_SUFFIXES)


def is_plain_name(text: str) -> bool:
    """A workflow name that cannot be taken for anything else: the DSL's name form
    (``[a-z0-9][a-z0-9_.-]*``: no path separator), no ``..``, and no definition file's or
    Python file's suffix. Only such a name is looked for in a definitions directory."""
    return (
        NAME_RE.fullmatch(text) is not None
        and ".." not in text
        and not text.endswith((*DEFINITION_SUFFIXES, ".py"))
    )


def is_python_reference(reference: object, *, files_only: bool = False) -> bool:
    """``flow.py``, ``flow.py:name`` or (unless ``files_only``) ``pkg.module[:name]``."""
    if isinstance(reference, Path):
        return reference.suffix == ".py"
    if not isinstance(reference, str) or "\n" in reference or not reference.strip():
        return False
    target, _, name = reference.partition(":")
    if target.endswith(".py"):
        return not name or name.isidentifier()
    if files_only or target.endswith(DEFINITION_SUFFIXES):
        return False
    parts = target.split(".")
    return all(part.isidentifier() for part in parts) and (not name or name.isidentifier())


def load_python_workflow(reference: str) -> Workflow:
    """The `Workflow` that ``flow.py[:name]`` or ``pkg.module[:name]`` defines."""
    target, _, name = reference.partition(":")
    module = _import_file(Path(target)) if target.endswith(".py") else _import_module(target)
    return _workflow_of(module, name or None, target)


def _unloadable(message: str, file: str | None) -> DefinitionUnreadable:
    hint = (
        f"define the workflow at module level (`{WORKFLOW_ATTRIBUTE} = Workflow(...)`), or "
        "name it: flow.py:name"
    )
    return DefinitionUnreadable([Diagnostic(message=message, file=file, hint=hint)])


def _import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise _unloadable(f"cannot read {path}: no such file", str(path))
    resolved = path.resolve()
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", "") or "").resolve() == resolved:
            return loaded
        raise _unloadable(
            f"cannot import {path} as module {name!r}: a module of that name is already "
            f"imported from {getattr(loaded, '__file__', None) or 'elsewhere'}; rename the file",
            str(path),
        )
    directory = str(resolved.parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)  # workers import the step functions by this name
    spec = importlib.util.spec_from_file_location(name, resolved)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        message = f"importing {path} failed: {type(exc).__name__}: {exc}"
        raise _unloadable(" ".join(message.split()), str(path)) from exc
    return module


def _import_module(name: str) -> ModuleType:
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(name)
    except Exception as exc:
        message = f"importing module {name!r} failed: {type(exc).__name__}: {exc}"
        raise _unloadable(" ".join(message.split()), None) from exc


def _workflow_of(module: ModuleType, name: str | None, target: str) -> Workflow:
    if name is not None:
        found = getattr(module, name, None)
        if not isinstance(found, Workflow):
            what = "nothing" if found is None else f"a {type(found).__name__}"
            raise _unloadable(f"{target}:{name} is {what}, not a tideflow Workflow", target)
        return found
    chosen = getattr(module, WORKFLOW_ATTRIBUTE, None)
    if isinstance(chosen, Workflow):
        return chosen
    workflows = {key: v for key, v in vars(module).items() if isinstance(v, Workflow)}
    if len(workflows) == 1:
        return next(iter(workflows.values()))
    if not workflows:
        raise _unloadable(f"{target} defines no tideflow Workflow", target)
    names = ", ".join(sorted(workflows))
    raise _unloadable(
        f"{target} defines several workflows ({names}) and none is named "
        f"`{WORKFLOW_ATTRIBUTE}`: choose one with {target}:<name>",
        target,
    )


class DefinitionSource:
    """Definition files in a directory, found by workflow name (for `subflow` and the CLI).

    ``find`` compares the name with the names the directory's ``.yaml``/``.yml``/``.json``
    files define: a name is never made into a path, and no Python file is imported."""

    def __init__(self, directory: str | Path | None, executors: ExecutorRegistry) -> None:
        self._dir = Path(directory) if directory is not None else None
        self._executors = executors
        self._index: dict[tuple[str, str], Plan] | None = None
        self._loading = threading.Lock()

    @property
    def directory(self) -> Path | None:
        return self._dir

    @staticmethod
    def looks_like_path(text: str) -> bool:
        return _is_path(text) or is_python_reference(text, files_only=True)

    def find(self, name: str, version: str | None) -> Plan | None:
        index = self._load()
        matches = [
            plan
            for (n, v), plan in index.items()
            if n == name and (version is None or v == version)
        ]
        if not matches:
            return None
        return max(matches, key=lambda p: version_key(p.version))

    def _load(self) -> dict[tuple[str, str], Plan]:
        with self._loading:  # looked up from threads (Catalog.registered): built once, whole
            if self._index is None:
                index: dict[tuple[str, str], Plan] = {}
                if self._dir is not None and self._dir.is_dir():
                    for path in sorted(self._dir.iterdir()):
                        if path.suffix in DEFINITION_SUFFIXES:
                            self._add(index, path)
                self._index = index
            return self._index

    def _add(self, index: dict[tuple[str, str], Plan], path: Path) -> None:
        try:
            plan = coerce_plan(path, self._executors)
        except (DefinitionError, OSError) as exc:
            log.debug("not a usable definition: %s (%s)", path, exc)
            return
        index[(plan.name, plan.version)] = plan
