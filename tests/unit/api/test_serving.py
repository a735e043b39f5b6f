"""`--http HOST:PORT`: any address with API tokens, a loopback address only with
`--no-auth`; bound before the server starts."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tideflow.api.serving import AddressRefused, listen, parse_address
from tideflow.cli.main import app


def test_a_loopback_address_is_parsed() -> None:
    assert parse_address("127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert parse_address("localhost:0") == ("localhost", 0)
    assert parse_address("[::1]:9000") == ("::1", 9000)
    assert parse_address("127.1.2.3:80") == ("127.1.2.3", 80)


PUBLIC = ["0.0.0.0:8080", "10.0.0.5:80", "example.com:80", "[::]:80"]


@pytest.mark.parametrize("address", PUBLIC)
def test_with_tokens_any_host_is_taken(address: str) -> None:
    host, port = parse_address(address)
    assert f"{host}:{port}" in address.replace("[", "").replace("]", "")


@pytest.mark.parametrize("address", PUBLIC)
def test_without_auth_any_other_host_is_refused_saying_why(address: str) -> None:
    with pytest.raises(AddressRefused, match="without authentication listens on a loopback"):
        parse_address(address, auth=False)
    assert parse_address("127.0.0.1:80", auth=False) == ("127.0.0.1", 80)


@pytest.mark.parametrize(
    "address", ["8080", "127.0.0.1", "127.0.0.1:http", ":80", "127.0.0.1:70000"]
)
def test_a_malformed_address_is_refused(address: str) -> None:
    with pytest.raises(AddressRefused, match="HOST:PORT"):
        parse_address(address)


def test_the_server_command_refuses_a_public_address_without_auth_before_it_starts() -> None:
    result = CliRunner().invoke(
        app, ["server", "--bus", "redis://127.0.0.1:1/0", "--http", "0.0.0.0:8080", "--no-auth"]
    )
    assert result.exit_code == 2
    assert "--no-auth" in result.output and "loopback" in result.output


def test_no_auth_without_http_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["server", "--bus", "redis://127.0.0.1:1/0", "--no-auth"])
    assert result.exit_code == 2
    assert "--http" in result.output


def test_a_port_in_use_is_an_error_before_the_server_starts() -> None:
    taken = listen("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        with pytest.raises(OSError):
            listen("127.0.0.1", port)
        result = CliRunner().invoke(
            app, ["server", "--bus", "redis://127.0.0.1:1/0", "--http", f"127.0.0.1:{port}"]
        )
        assert result.exit_code == 2
        assert "cannot listen there" in result.output
    finally:
        taken.close()
    assert isinstance(taken, socket.socket)


def test_a_bad_event_sources_file_is_an_error_before_the_server_starts(tmp_path: Path) -> None:
    sources = tmp_path / "sources.yaml"
    sources.write_text("sources:\n  - {source: 'urn:a', auth: bearer, token_env: TF_TEST_UNSET}\n")
    command = ["server", "--bus", "redis://127.0.0.1:1/0", "--http", "127.0.0.1:0"]
    result = CliRunner().invoke(
        app, [*command, "--event-sources", str(sources)], env={"TF_TEST_UNSET": ""}
    )
    assert result.exit_code == 2
    assert "the environment variable TF_TEST_UNSET (token_env) is not set" in result.output
    assert str(sources) in result.output


def test_event_sources_need_the_http_api(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["server", "--bus", "redis://127.0.0.1:1/0", "--event-sources", str(tmp_path)]
    )
    assert result.exit_code == 2
    assert "give --http too" in result.output
