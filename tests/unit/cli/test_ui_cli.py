"""`tideflow ui` refuses what it cannot serve safely, before it opens anything."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tideflow.cli.main import app


def test_the_ui_listens_on_loopback_only_and_says_so(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'ui.db'}"
    result = CliRunner().invoke(app, ["ui", "--store", store, "--http", "0.0.0.0:0"])
    assert result.exit_code == 2, result.output
    assert "loopback address only" in result.output
    assert "--no-auth" not in result.output
    assert not (tmp_path / "ui.db").exists()  # nothing was opened


def test_a_malformed_address_is_named() -> None:
    result = CliRunner().invoke(app, ["ui", "--http", "nowhere"])
    assert result.exit_code == 2
    assert "give HOST:PORT" in result.output


@pytest.mark.parametrize("command", ["ui", "server"])
@pytest.mark.parametrize(
    ("name", "value"), [("TIDEFLOW_COMPILE_WORKERS", "0"), ("TIDEFLOW_COMPILE_TIMEOUT", "soon")]
)
def test_a_wrong_compile_bound_is_an_exit_2_naming_it(
    tmp_path: Path, command: str, name: str, value: str
) -> None:
    store = f"sqlite:///{tmp_path / 'ui.db'}"
    args = [command, "--store", store, "--http", "127.0.0.1:0"]
    if command == "server":
        args += ["--embedded", "--no-auth"]
    result = CliRunner().invoke(app, args, env={name: value})
    assert result.exit_code == 2, result.output
    assert name in result.output and "positive" in result.output
