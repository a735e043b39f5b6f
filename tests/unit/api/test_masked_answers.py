"""One set of masking rules for every view of run data: a step output with a
``password`` key (and a field the definition declares ``sensitive``) is masked in the
API's answers, in the CLI's output and in a log line alike, while a key that merely
contains the letters (``passenger``) is shown everywhere."""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from typer.testing import CliRunner

from tideflow.api.serving import address_of, http_api, listen
from tideflow.cli.main import app
from tideflow.lifecycle import Stop
from tideflow.model.masking import is_credential_key, mask
from tideflow.observability.logs import REDACTED, configure
from tideflow.runtime.runtime import Runtime
from tideflow.store.backends.sqlite import SqliteStore
from tideflow.worker.executors.functions import register, unregister

PASSWORD = "hunter2-correct-horse"
CARD = "4000-0566-5566-5556"
OUTPUT = {"password": PASSWORD, "passenger": "Ann Lee", "card": CARD, "seat": "12C"}
FLOW = {
    "name": "booking",
    "version": "1",
    "steps": [
        {"id": "book", "type": "python", "function": "masked.book", "sensitive": ["card"]},
    ],
}


@pytest.fixture(autouse=True)
def book() -> Iterator[None]:
    register("masked.book")(lambda: dict(OUTPUT))
    yield
    unregister("masked.book")


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    level, before = root.level, list(root.handlers)
    buffer = io.StringIO()
    configure("info", "json", buffer, secrets=[])
    yield buffer
    for handler in list(root.handlers):
        if handler not in before:
            root.removeHandler(handler)
    root.setLevel(level)


def shows_only_what_may_be_seen(text: str) -> None:
    assert PASSWORD not in text
    assert CARD not in text
    assert "Ann Lee" in text and "12C" in text


async def answers(rt: Runtime, run_id: str) -> dict[str, Any]:
    sock = listen("127.0.0.1", 0)
    async with (
        http_api(rt.client, Stop(), sock, auth=False),
        httpx.AsyncClient(base_url=address_of(sock), timeout=20) as api,
    ):
        paths = [
            f"/runs/{run_id}",
            f"/runs/{run_id}/history",
            f"/runs/{run_id}/steps/book",
            f"/runs/{run_id}/attempts",
            "/runs",
        ]
        got = {}
        for path in paths:
            response = await api.get(path)
            assert response.status_code == 200, (path, response.text)
            got[path] = response.json()
        return got


async def run_and_ask(url: str) -> tuple[str, dict[str, Any]]:
    async with Runtime(store=SqliteStore(url)) as rt:
        result = await rt.run(FLOW)
        assert result.status == "succeeded"
        state = await rt.state(result.run_id)
        assert state.steps["book"].output == OUTPUT  # the engine keeps the values
        return result.run_id, await answers(rt, result.run_id)


def test_a_password_key_is_masked_in_the_api_the_cli_and_a_log_line_alike(
    tmp_path: Path, log_lines: io.StringIO
) -> None:
    url = f"sqlite:///{tmp_path / 'masked.db'}"
    run_id, got = asyncio.run(run_and_ask(url))  # the CLI below runs a loop of its own

    run = got[f"/runs/{run_id}"]
    assert run["steps"]["book"]["output"] == {
        "password": "***",
        "passenger": "Ann Lee",
        "card": "***",
        "seat": "12C",
    }
    for path, body in got.items():
        text = orjson.dumps(body).decode()
        assert PASSWORD not in text and CARD not in text, path
    shows_only_what_may_be_seen(orjson.dumps(got[f"/runs/{run_id}/history"]).decode())
    shows_only_what_may_be_seen(orjson.dumps(got[f"/runs/{run_id}/steps/book"]).decode())
    shows_only_what_may_be_seen(orjson.dumps(got["/runs"]).decode())

    runner = CliRunner()
    for args in (
        ["runs", "show", run_id, "--json"],
        ["runs", "show", run_id],
        ["runs", "history", run_id, "--json"],
        ["runs", "list", "--json"],
    ):
        done = runner.invoke(app, [*args, "--store", url])
        assert done.exit_code == 0, (args, done.output)
        assert PASSWORD not in done.output and CARD not in done.output, args
    shown = runner.invoke(app, ["runs", "history", run_id, "--json", "--store", url])
    shows_only_what_may_be_seen(shown.output)

    logging.getLogger("tideflow.test.masked").info("booked", extra={"output": OUTPUT})
    line = orjson.loads(log_lines.getvalue().splitlines()[-1])
    assert line["output"] == {
        "password": REDACTED,
        "passenger": "Ann Lee",
        "card": CARD,  # a log line does not know the definition: no sensitive names
        "seat": "12C",
    }
    assert line["output"] == mask(OUTPUT, placeholder=REDACTED)


@pytest.mark.parametrize(
    "key",
    [
        "password",
        "db_password",
        "userPassword",
        "X-Api-Key",
        "apikey",
        "client_secret",
        "accessToken",
        "refresh_token",
        "Authorization",
        "session_cookie",
        "private_key",
        "credentials",
        "passwd",
        "pwd",
        "secret",
    ],
)
def test_keys_that_name_a_credential(key: str) -> None:
    assert is_credential_key(key)
    assert mask({key: "v", "n": 1}) == {key: "***", "n": 1}


@pytest.mark.parametrize(
    "key", ["passenger", "bypass", "tokenizer", "secretary", "author", "keys", "status"]
)
def test_keys_that_only_contain_the_letters_are_shown(key: str) -> None:
    assert not is_credential_key(key)
    value = {key: "v"}
    assert mask(value) is value  # nothing to mask: no copy


def test_declared_names_mask_at_any_depth_or_by_path_and_lists_are_transparent() -> None:
    value = {
        "card_number": "4111",
        "customer": {"name": "Ann", "card_number": "4222", "address": {"zip": "1000"}},
        "items": [{"sku": "a", "price": 1}, {"sku": "b", "price": 2, "token": "t"}],
    }
    assert mask(value, ["card_number", "customer.address", "items.price"]) == {
        "card_number": "***",
        "customer": {"name": "Ann", "card_number": "***", "address": "***"},
        "items": [{"sku": "a", "price": "***"}, {"sku": "b", "price": "***", "token": "***"}],
    }
    assert value["card_number"] == "4111"  # the original is untouched
