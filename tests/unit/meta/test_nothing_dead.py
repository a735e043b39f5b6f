"""Dead code cannot come back unnoticed: every name the engine's inner packages define is
used somewhere in the package, and every runtime dependency is imported."""

from __future__ import annotations

import ast
import re
import tomllib
from collections import Counter
from pathlib import Path

SRC = Path(__file__).resolve().parents[3] / "src" / "tideflow"
PYPROJECT = SRC.parents[1] / "pyproject.toml"
INNER = ("model", "core", "runtime", "store", "bus")
"""Packages with no entry points of their own (no CLI commands registered by decorator,
no names for users to import): a name defined there and used nowhere is dead."""

CALLBACKS = frozenset({"connection_made", "datagram_received", "error_received"})
"""Methods asyncio calls on a protocol object: used, though no tideflow code names them."""

FOR_OTHERS = {
    # httpcore (under httpx) imports it on every request and pays a failed import, a
    # sys.path scan, each time it is missing (encode/httpcore#1103)
    "sniffio",
}
"""Dependencies declared for another dependency's sake: tideflow does not import them."""
IMPORT_NAMES = {"pyyaml": "yaml", "google_re2": "re2"}
"""Distributions whose import name differs from their name."""


def _sources() -> dict[Path, str]:
    return {path: path.read_text(encoding="utf-8") for path in SRC.rglob("*.py")}


def _defined(tree: ast.Module) -> list[str]:
    """Module-level names and the methods of module-level classes."""
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.append(node.name)
        elif isinstance(node, ast.ClassDef):
            names.append(node.name)
            names += [
                f"{node.name}.{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                and not item.name.startswith("__")
            ]
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return names


def test_every_name_defined_in_the_inner_packages_is_used() -> None:
    sources = _sources()
    words: Counter[str] = Counter()
    for text in sources.values():
        words.update(re.findall(r"\w+", text))
    unused = []
    for path, text in sources.items():
        if path.relative_to(SRC).parts[0] not in INNER:
            continue
        here = Counter(re.findall(r"\w+", text))
        for name in _defined(ast.parse(text)):
            word = name.rsplit(".", 1)[-1]
            if word in CALLBACKS:
                continue
            private = word.startswith("_")  # used in its own module, or nowhere
            if not word.startswith("__") and (here if private else words)[word] < 2:
                unused.append(f"{path.relative_to(SRC)}: {name}")
    assert unused == [], "defined but never used (delete them):\n" + "\n".join(unused)


def _imported_top_levels(sources: dict[Path, str]) -> set[str]:
    found: set[str] = set()
    for text in sources.values():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
    return found


def _distribution(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9_.-]+", requirement)
    assert match is not None, requirement
    return match.group(0).lower().replace("-", "_")


def test_every_runtime_dependency_is_imported_and_every_mypy_plugin_is_one() -> None:
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))
    imported = _imported_top_levels(_sources())
    dependencies = [_distribution(r) for r in project["project"]["dependencies"]]
    unused = [
        d for d in dependencies if IMPORT_NAMES.get(d, d) not in imported and d not in FOR_OTHERS
    ]
    assert unused == [], f"declared dependencies that tideflow never imports: {unused}"
    plugins = project["tool"]["mypy"].get("plugins", [])
    orphans = [
        p for p in plugins if p.split(".")[0] not in {IMPORT_NAMES.get(d, d) for d in dependencies}
    ]
    assert orphans == [], f"mypy plugins for packages tideflow does not depend on: {orphans}"


def test_every_field_of_a_transition_is_recorded_in_the_history() -> None:
    from tideflow.model.codec import transition_to_data
    from tideflow.model.events import Transition

    recorded = transition_to_data(
        Transition(subject="run", old=None, new="running", time=0.0, cause="c")
    )
    assert set(recorded) == set(Transition._fields)
