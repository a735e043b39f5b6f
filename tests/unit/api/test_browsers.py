"""The pieces of api/browsers.py and api/docs_pages.py on their own: reading a Host
header, the names ``--allowed-host`` takes, which hosts an app answers to with and
without tokens, what a route takes, how the OpenAPI document says it, and /docs and
/redoc served from the bundled assets (what they keep out is
tests/contract/test_browser_refusals.py)."""

from __future__ import annotations

import re
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from typer.testing import CliRunner

from tideflow.api import create_app
from tideflow.api.browsers import LOOPBACK_HOSTS, allowed_hosts, host_of
from tideflow.api.serving import hosts_of
from tideflow.cli.main import app as cli
from tideflow.runtime.runtime import Runtime


@pytest.mark.parametrize(
    ("value", "host"),
    [
        ("localhost", "localhost"),
        ("LocalHost:8080", "localhost"),
        ("127.0.0.1:80", "127.0.0.1"),
        ("[::1]", "::1"),
        ("[::1]:8080", "::1"),
        ("api.example.com", "api.example.com"),
        ("", None),
        (":8080", None),
        ("localhost:", None),
        ("localhost:http", None),
        ("localhost:8080:1", None),
        ("::1", None),  # an IPv6 address is bracketed in a Host header
        ("[::1", None),
        ("[::1]x", None),
        ("[localhost]", None),
        ("evil.example/path", None),
        ("evil example", None),
        ("localhost:\uff11\uff12", None),  # fullwidth digits are not a port
    ],
)
def test_a_host_header_is_read_as_http_writes_it(value: str, host: str | None) -> None:
    assert host_of(value) == host


def test_allowed_hosts_take_names_and_addresses_without_a_port() -> None:
    hosts = allowed_hosts(["Tideflow.Example.com", "10.0.0.5", "[fd00::1]", "fd00::2"], auth=False)
    assert hosts == LOOPBACK_HOSTS | {"tideflow.example.com", "10.0.0.5", "fd00::1", "fd00::2"}
    assert allowed_hosts(None, auth=False) == LOOPBACK_HOSTS
    assert allowed_hosts(None, auth=True) is None  # tokens: any host unless told
    assert allowed_hosts([], auth=True) == LOOPBACK_HOSTS
    assert allowed_hosts(["*"], auth=True) is None
    for bad in ("evil.example:80", "a b", "http://x", ""):
        with pytest.raises(ValueError, match="without a port"):
            allowed_hosts([bad], auth=True)
    with pytest.raises(ValueError, match="always checks the Host header"):
        allowed_hosts(["*"], auth=False)
    with pytest.raises(ValueError, match="always checks the Host header"):
        create_app(None, auth=False, allowed_hosts=["*"])  # type: ignore[arg-type]


def test_a_served_api_answers_to_its_bound_address_and_any_host_on_a_wildcard_with_tokens() -> None:
    with socket.socket() as loopback, socket.socket() as wildcard:
        loopback.bind(("127.0.0.1", 0))
        wildcard.bind(("0.0.0.0", 0))
        assert hosts_of(loopback, ["a.example"], auth=True) == ["a.example", "127.0.0.1"]
        assert hosts_of(loopback, [], auth=False) == ["127.0.0.1"]
        assert hosts_of(wildcard, [], auth=True) is None
        assert hosts_of(wildcard, ["a.example"], auth=True) == ["a.example"]
        assert hosts_of(wildcard, [], auth=False) == []


@pytest.fixture
async def rt() -> AsyncIterator[Runtime]:
    async with Runtime(workers=0) as runtime:
        yield runtime


def client_of(app: FastAPI, base: str = "http://localhost") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base)


async def test_with_tokens_any_host_is_answered_unless_hosts_are_named(rt: Runtime) -> None:
    async with client_of(create_app(rt.client), "http://tideflow.example.com") as api:
        assert (await api.get("/health")).status_code == 200
    named = create_app(rt.client, allowed_hosts=["tideflow.example.com"])
    async with client_of(named, "http://tideflow.example.com:443") as api:
        assert (await api.get("/health")).status_code == 200
        refused = await api.get("/health", headers={"host": "evil.example"})
        assert refused.status_code == 421
        assert "tideflow.example.com" in refused.json()["detail"]
        assert (await api.get("/health", headers={"host": "localhost:1"})).status_code == 200


async def asgi_status(app: FastAPI, method: str, headers: list[tuple[bytes, bytes]]) -> int:
    """The status ``app`` answers a request with exactly ``headers`` (httpx always
    writes one Host header)."""
    sent: list[int] = []

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, object]) -> None:
        if message["type"] == "http.response.start":
            sent.append(int(message["status"]))  # type: ignore[call-overload]

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": "/runs/x/cancel" if method == "POST" else "/health",
        "raw_path": b"",
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    await app(scope, receive, send)  # type: ignore[arg-type]
    return sent[0]


async def test_no_host_or_two_and_two_content_types_are_refused(rt: Runtime) -> None:
    app = create_app(rt.client, auth=False)
    assert await asgi_status(app, "GET", []) == 421
    assert await asgi_status(app, "GET", [(b"host", b"localhost"), (b"host", b"evil")]) == 421
    assert await asgi_status(app, "GET", [(b"host", b"localhost")]) == 200
    json = (b"content-type", b"application/json")
    twice = [(b"host", b"localhost"), json, (b"content-type", b"text/plain")]
    assert await asgi_status(app, "POST", twice) == 415
    assert await asgi_status(app, "POST", [(b"host", b"localhost"), json]) == 404  # no run x


async def test_the_event_gateway_takes_any_type(rt: Runtime) -> None:
    async with client_of(create_app(rt.client, auth=False)) as api:
        response = await api.post(
            "/events", content=b"hello", headers={"content-type": "text/plain"}
        )
    assert response.status_code not in (415, 421)
    assert response.status_code < 500, response.text


async def test_the_openapi_document_says_415_where_it_can_come_and_421_when_checked(
    rt: Runtime,
) -> None:
    for auth, checked in ((False, True), (True, False)):
        async with client_of(create_app(rt.client, auth=auth)) as api:
            schema = (await api.get("/openapi.json")).json()
        for path, item in schema["paths"].items():
            for method, operation in item.items():
                responses = operation["responses"]
                changes = method in {"post", "put", "patch", "delete"}
                assert ("415" in responses) is changes, (path, method)
                assert ("421" in responses) is checked, (path, method)
                if changes and path != "/events":
                    assert "Content-Type" in responses["415"]["description"]


ASSET = re.compile(r'(?:src|href)="([^"]+)"')


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_the_docs_pages_load_only_assets_this_server_serves(rt: Runtime, page: str) -> None:
    async with client_of(create_app(rt.client, auth=False)) as api:
        html = await api.get(page)
        assert html.status_code == 200
        assert "cdn" not in html.text.lower() and "https://" not in html.text
        assets = ASSET.findall(html.text)
        assert any(a.endswith(".js") for a in assets), assets
        for asset in assets:
            assert asset.startswith("/docs/assets/"), asset
            served = await api.get(asset)
            assert served.status_code == 200, asset
            assert len(served.content) > 1000, asset
        assert "/openapi.json" in html.text
        assert (await api.get("/docs/oauth2-redirect")).status_code == 200


async def test_swagger_uis_try_it_out_sends_a_json_type_on_every_change(rt: Runtime) -> None:
    async with client_of(create_app(rt.client, auth=False)) as api:
        html = (await api.get("/docs")).text
    assert "requestInterceptor" in html and 'request.headers["Content-Type"]' in html


def test_the_cli_refuses_a_bad_allowed_host_before_it_opens_anything(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'x.db'}"
    server = ["server", "--embedded", "--store", store, "--http", "127.0.0.1:0"]
    for args, said in (
        ([*server, "--allowed-host", "evil.example:80"], "without a port"),
        ([*server, "--no-auth", "--allowed-host", "*"], "always checks the Host header"),
        (["server", "--embedded", "--store", store, "--allowed-host", "a"], "give --http"),
        (["ui", "--store", store, "--http", "127.0.0.1:0", "--allowed-host", "*"], "not *"),
    ):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2, (args, result.output)
        assert said in result.output, (args, result.output)
    assert not (tmp_path / "x.db").exists()
