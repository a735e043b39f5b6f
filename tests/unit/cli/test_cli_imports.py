"""The `tideflow` command starts fast: importing it (as `tideflow --help` and `--version`
do, since typer needs every command to list them) imports neither the engine nor the
libraries only some commands need. Each command imports what it uses when it runs.

Speed itself is measured by bench/cli.py, never timed here."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

import pytest

HEAVY = (
    # third-party libraries only some commands need
    "asyncio",
    "asyncpg",
    "fastapi",
    "httpx",
    "jsonschema",
    "nats",
    "redis",
    "starlette",
    "uvicorn",
    "yaml",
    "rich.live",
    "importlib.metadata",
    "sqlite3",
    # the engine, the compiler, the client, the store's model, the bus, the API
    "tideflow.api.app",
    "tideflow.api.auth",
    "tideflow.bus.base",
    "tideflow.client",
    "tideflow.core",
    "tideflow.dsl",
    "tideflow.model.plan",
    "tideflow.model.run",
    "tideflow.remote_http",
    "tideflow.runtime",
    "tideflow.store.base",
    "tideflow.worker",
)


def _imported_by(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    probe = f"{code}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    return set(json.loads(done.stdout.splitlines()[-1]))


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def test_importing_the_command_imports_nothing_heavy() -> None:
    assert _heavy(_imported_by("import tideflow.cli.main")) == []


@pytest.mark.parametrize("argv", [["--version"], ["--help"]])
def test_help_and_version_import_nothing_heavy(argv: list[str]) -> None:
    code = (
        "from tideflow.cli.main import app\n"
        f"try:\n    app({argv!r}, prog_name='tideflow')\nexcept SystemExit:\n    pass"
    )
    assert _heavy(_imported_by(code)) == []


def test_the_package_imports_its_public_names_on_use() -> None:
    """``import tideflow`` is light; a public name brings its module when first read."""
    assert "tideflow.client" not in _imported_by("import tideflow")
    assert "tideflow.client" in _imported_by("import tideflow\ntideflow.Client")


def test_the_probe_sees_a_heavy_import() -> None:
    """The check above can fail: a command that did import the engine is caught."""
    assert "tideflow.client" in _heavy(_imported_by("import tideflow.cli.main, tideflow.client"))


def test_the_version_printed_is_the_installed_distributions() -> None:
    import tideflow

    assert tideflow.__version__ == importlib.metadata.version("tideflow")
