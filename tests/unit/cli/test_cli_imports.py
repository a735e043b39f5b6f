"""The `tideflow` command starts fast: `--version` imports neither typer nor rich,
`--help` lists the commands without importing any command module (cli/app.py), and each
command imports what it uses when it runs: never the engine, nor the libraries only some
commands need, to start; `runs list` reads a SQLite store with neither the engine nor
the compiler nor pydantic.

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
    "pydantic",  # typer converts options through it (cli/params.py converts plain ones)
    "typer._adapters",
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
    assert _heavy(_imported_by("import tideflow.cli.main, tideflow.cli.app")) == []


def _command(argv: list[str]) -> str:
    """Code running `tideflow ARGV` as the installed command does (``main``)."""
    return (
        f"import sys\nsys.argv = ['tideflow', *{argv!r}]\n"
        "from tideflow.cli.main import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass"
    )


@pytest.mark.parametrize("argv", [["--version"], ["-V"], ["--version", "runs"]])
def test_version_imports_neither_typer_nor_rich(argv: list[str]) -> None:
    modules = _imported_by(_command(argv))
    assert sorted(m for m in modules if m.split(".")[0] in ("typer", "rich", "click")) == []
    assert _heavy(modules) == []


def test_version_is_printed_by_the_command_and_by_the_app() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _command(["--version"])],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    from typer.testing import CliRunner

    from tideflow.cli.main import app

    answered = CliRunner().invoke(app, ["--version"])
    assert answered.exit_code == 0
    assert done.stdout == answered.stdout == f"tideflow {importlib.metadata.version('tideflow')}\n"


LISTING = {"tideflow.cli", "tideflow.cli.main", "tideflow.cli.app", "tideflow.cli.params"}


@pytest.mark.parametrize("argv", [["--help"], []])
def test_help_imports_no_command(argv: list[str]) -> None:
    """The root help lists every command from cli/app.py's table: no command module."""
    modules = _imported_by(_command(argv))
    assert _heavy(modules) == []
    assert {m for m in modules if m.startswith("tideflow.cli")} == LISTING


def test_a_group_help_imports_that_group_alone() -> None:
    modules = _imported_by(_command(["runs", "--help"]))
    assert _heavy(modules) == []
    assert "tideflow.cli.runs" in modules
    assert {"tideflow.cli.db", "tideflow.cli.tokens", "tideflow.cli.ui"} & modules == set()


@pytest.fixture(scope="module")
def sqlite_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SQLite store holding a finished run of a titled definition."""
    directory = tmp_path_factory.mktemp("store")
    url = f"sqlite:///{directory / 'runs.db'}"
    code = (
        "import asyncio\n"
        "from tideflow.runtime.runtime import Runtime\n"
        "flow = {'name': 'f', 'version': '1', 'title': 'A flow', "
        "'steps': [{'id': 'a', 'type': 'noop'}]}\n"
        "async def main():\n"
        f"    async with Runtime(store={url!r}) as rt:\n"
        "        await rt.client.register(flow)\n"
        "        await rt.client.wait(await rt.client.start('f', {}))\n"
        "asyncio.run(main())\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=directory)
    return url


READER_FORBIDDEN = (
    "pydantic",
    "jsonschema",
    "croniter",
    "tideflow.dsl",
    "tideflow.bus",
    "tideflow.client",
    "tideflow.runtime.engine",
    "tideflow.runtime.runtime",
    "tideflow.worker",
)


def test_runs_list_reads_a_sqlite_store_without_the_engine(sqlite_store: str) -> None:
    """`runs list` opens the store and reads a page: no compiler, no engine, no bus, no
    pydantic (its --json, which masks outputs by their plans, may import more)."""
    code = _command(["runs", "list", "--store", sqlite_store])
    modules = _imported_by(code)
    assert "tideflow.store.backends.sqlite" in modules  # the probe ran the command
    found = sorted(
        m for m in modules if any(m == f or m.startswith(f + ".") for f in READER_FORBIDDEN)
    )
    assert found == []


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
