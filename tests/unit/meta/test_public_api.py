"""Lock the public API and the direction of imports between layers."""

from __future__ import annotations

import ast
from pathlib import Path

import tideflow

PACKAGE = Path(tideflow.__file__).parent


def test_public_api_is_exactly_this():
    assert sorted(tideflow.__all__) == sorted(
        [
            "Client",
            "DefinitionError",
            "Executor",
            "Plan",
            "RunResult",
            "RunStatus",
            "Runtime",
            "StepContext",
            "StepError",
            "StepResult",
            "StepStatus",
            "TideflowError",
            "Workflow",
            "__version__",
            "compile_definition",
            "load_plan",
            "register",
            "validate",
        ]
    )
    for name in tideflow.__all__:
        assert hasattr(tideflow, name), name


# Each inner layer may import only these tideflow subpackages (besides itself).
ALLOWED = {
    "model": {"errors"},
    "dsl": {"model", "errors"},
    "core": {"model", "errors"},
    "store": {"model", "errors"},
    "bus": {"model", "errors"},
}


def _tideflow_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tideflow."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("tideflow."):
                    found.add(alias.name.split(".")[1])
    return found


def test_imports_point_inward():
    problems = []
    for layer, allowed in ALLOWED.items():
        for path in (PACKAGE / layer).rglob("*.py"):
            bad = _tideflow_imports(path) - allowed - {layer}
            if bad:
                problems.append(f"{path.relative_to(PACKAGE)} imports {sorted(bad)}")
    assert not problems, "\n".join(problems)


# The engine's insides: only the runtime itself (and its composer) may import them.
ENGINE_INTERNALS = {
    "tideflow.runtime.scheduler",
    "tideflow.runtime.relay",
    "tideflow.runtime.engine",
    "tideflow.runtime.recovery",
    "tideflow.runtime.runs",
    "tideflow.runtime.timers",
    "tideflow.runtime.commits",
    "tideflow.runtime.poison",
}
HOSTS_AN_ENGINE = {"cli/common.py"}
"""CLI modules that may build the embedded composer (`Runtime`), to run an engine
(`tideflow run`, `resume`) or to record for the next one; every other part of the CLI
goes through the client."""


def _tideflow_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tideflow"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("tideflow"))
    return found


def test_the_worker_does_not_import_the_runtime():
    problems = [
        f"{path.relative_to(PACKAGE)} imports {sorted(bad)}"
        for path in (PACKAGE / "worker").rglob("*.py")
        if (bad := {m for m in _tideflow_modules(path) if m.startswith("tideflow.runtime")})
    ]
    assert not problems, "\n".join(problems)


def test_the_cli_and_the_client_use_no_engine_internals():
    paths = [PACKAGE / "client.py", *(PACKAGE / "cli").rglob("*.py")]
    for extra in ("api", "ui"):  # the coming HTTP API and UI sit where the CLI does
        paths.extend((PACKAGE / extra).rglob("*.py"))
    problems = []
    for path in paths:
        modules = _tideflow_modules(path)
        bad = modules & ENGINE_INTERNALS
        if str(path.relative_to(PACKAGE)) not in HOSTS_AN_ENGINE and path.name != "client.py":
            bad |= {m for m in modules if m.startswith("tideflow.runtime.runtime")}
        if bad:
            problems.append(f"{path.relative_to(PACKAGE)} imports {sorted(bad)}")
    assert not problems, "\n".join(problems)
