"""Lock the public API and the direction of imports between layers."""

from __future__ import annotations

import ast
from pathlib import Path

import tideflow

PACKAGE = Path(tideflow.__file__).parent


def test_public_api_is_exactly_this():
    assert sorted(tideflow.__all__) == sorted(
        [
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
