"""One integer rule on every edge (model/storable.py): a number a run cannot hold exactly
(2**70, -2**70) is refused with a 4xx naming its field, and nothing is stored; 2**63,
inside the range, arrives exact (never a float), on SQLite and PostgreSQL.

The edges: the REST API's run input and signal payload, definitions in JSON and YAML, the
CloudEvents gateway in structured, batched and binary mode, and the CLI's JSON options.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import typer

from tideflow.api import create_app
from tideflow.api.event_sources import EventSources
from tideflow.cli.common import parse_json_option
from tideflow.runtime.runtime import Runtime
from tideflow.testing.waiting import step_is, wait_until

from .conftest import Backend

TOKEN = "desk-token-0123456789abcdef"
SOURCES = EventSources.of(
    {"sources": [{"source": "urn:desk", "auth": "bearer", "token_env": "DESK"}]},
    {"DESK": TOKEN},
)
ECHO = {
    "name": "echo",
    "version": "1",
    "steps": [{"id": "go", "type": "wait", "signal": "go"}],
    "output": {"input": "{{ inputs }}", "signal": "{{ steps.go.output }}"},
}
TOO_BIG = [2**70, -(2**70)]
EXACT = 2**63


def number(n: int) -> bytes:
    return str(n).encode()


@pytest.fixture
async def rt(sql_backend: Backend) -> AsyncIterator[Runtime]:
    async with Runtime(store=sql_backend.make(), workers=1) as runtime:
        await runtime.client.register(ECHO)
        yield runtime


@pytest.fixture
async def api(rt: Runtime) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(rt.client, auth=False, event_sources=SOURCES, ui=False)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        yield client


async def waiting(rt: Runtime, input: Any = None) -> str:
    run_id = await rt.client.start("echo", input)
    await wait_until(rt, run_id, step_is("go", "waiting"))
    return run_id


async def output(api: httpx.AsyncClient, rt: Runtime, run_id: str) -> Any:
    await rt.client.wait(run_id, timeout=10)
    answer = await api.get(f"/runs/{run_id}")
    return json.loads(answer.content)["output"]  # the stdlib keeps integers exact


async def signals(rt: Runtime, run_id: str) -> int:
    return sum(e.kind == "signal_received" for e in await rt.client.history(run_id))


def named(answer: httpx.Response, field: str, digits: int) -> None:
    """A 4xx whose problem names ``field`` and says what is wrong with the number."""
    assert 400 <= answer.status_code < 500, answer.text
    problem = answer.json()
    fields = [e["field"] for e in problem.get("errors", [])]
    assert field in fields or field in problem["detail"], problem
    assert str(digits) in answer.text and "2**63 .. 2**64-1" in answer.text


@pytest.mark.parametrize("n", TOO_BIG)
async def test_a_run_input_out_of_range_is_refused_and_starts_nothing(
    rt: Runtime, api: httpx.AsyncClient, n: int
) -> None:
    body = b'{"workflow": "echo", "input": {"order": {"n": ' + number(n) + b"}}}"
    answer = await api.post("/runs", content=body, headers={"content-type": "application/json"})
    named(answer, "body.input.order.n", n)
    assert (await rt.client.list()).runs == []


@pytest.mark.parametrize("n", TOO_BIG)
async def test_a_signal_payload_out_of_range_is_refused_and_applies_nothing(
    rt: Runtime, api: httpx.AsyncClient, n: int
) -> None:
    run_id = await waiting(rt)
    body = b'{"name": "go", "payload": {"n": [1, ' + number(n) + b"]}}"
    answer = await api.post(
        f"/runs/{run_id}/signals", content=body, headers={"content-type": "application/json"}
    )
    named(answer, "n[1]", n)
    assert await signals(rt, run_id) == 0


async def test_two_to_the_63_goes_through_rest_exact(rt: Runtime, api: httpx.AsyncClient) -> None:
    body = b'{"workflow": "echo", "input": {"n": ' + number(EXACT) + b"}}"
    started = await api.post("/runs", content=body, headers={"content-type": "application/json"})
    assert started.status_code == 201, started.text
    run_id = started.json()["run_id"]
    await wait_until(rt, run_id, step_is("go", "waiting"))
    payload = b'{"name": "go", "payload": {"m": ' + number(-(2**63)) + b"}}"
    sent = await api.post(
        f"/runs/{run_id}/signals", content=payload, headers={"content-type": "application/json"}
    )
    assert sent.status_code == 202, sent.text
    assert await output(api, rt, run_id) == {"input": {"n": EXACT}, "signal": {"m": -(2**63)}}


def _definition_json(n: int) -> bytes:
    return (
        b'{"name": "big", "version": "1", "steps": [{"id": "a", "type": "noop", '
        b'"input": {"n": ' + number(n) + b"}}]}"
    )


def _definition_yaml(n: int) -> bytes:
    return b"name: big\nversion: '1'\nsteps:\n  - id: a\n    type: noop\n    input: {n: %s}\n" % (
        number(n)
    )


@pytest.mark.parametrize("n", TOO_BIG)
@pytest.mark.parametrize(
    ("encode", "media", "position"),
    [(_definition_json, "application/json", None), (_definition_yaml, "application/yaml", 6)],
    ids=["json", "yaml"],
)
async def test_a_definition_with_an_integer_out_of_range_is_refused_where_it_is(
    rt: Runtime, api: httpx.AsyncClient, n: int, encode: Any, media: str, position: int | None
) -> None:
    answer = await api.post("/definitions", content=encode(n), headers={"content-type": media})
    named(answer, "body.steps[0].input.n", n)
    (error,) = answer.json()["errors"]
    assert error.get("line") == position
    assert [d.name for d in await rt.client.definitions()] == ["echo"]


@pytest.mark.parametrize("encode", [_definition_json, _definition_yaml], ids=["json", "yaml"])
async def test_a_definition_with_two_to_the_63_is_stored_exact(
    api: httpx.AsyncClient, encode: Any
) -> None:
    media = "application/json" if encode is _definition_json else "application/yaml"
    answer = await api.post("/definitions", content=encode(EXACT), headers={"content-type": media})
    assert answer.status_code == 201, answer.text
    stored = await api.get("/definitions/big/1")
    assert json.loads(stored.content)["source"]["steps"][0]["input"] == {"n": EXACT}


def _structured(run_id: str, data: bytes) -> tuple[dict[str, str], bytes, str]:
    body = (
        b'{"specversion": "1.0", "id": "e1", "source": "urn:desk", "type": "go", '
        b'"tideflowrunid": "' + run_id.encode() + b'", "data": ' + data + b"}"
    )
    return {"content-type": "application/cloudevents+json"}, body, "body.data"


def _batch(run_id: str, data: bytes) -> tuple[dict[str, str], bytes, str]:
    first = b'{"specversion": "1.0", "id": "e0", "source": "urn:desk", "type": "other"}'
    _, second, _ = _structured(run_id, data)
    body = b"[" + first + b", " + second + b"]"
    return {"content-type": "application/cloudevents-batch+json"}, body, "body[1].data"


def _binary(run_id: str, data: bytes) -> tuple[dict[str, str], bytes, str]:
    headers = {
        "content-type": "application/json",
        "ce-specversion": "1.0",
        "ce-id": "e1",
        "ce-source": "urn:desk",
        "ce-type": "go",
        "ce-tideflowrunid": run_id,
    }
    return headers, data, "body"


ENCODINGS = [_structured, _batch, _binary]


@pytest.mark.parametrize("n", TOO_BIG)
@pytest.mark.parametrize("encode", ENCODINGS, ids=["structured", "batch", "binary"])
async def test_an_event_with_an_integer_out_of_range_is_refused_and_applies_nothing(
    rt: Runtime, api: httpx.AsyncClient, n: int, encode: Any
) -> None:
    run_id = await waiting(rt)
    headers, body, where = encode(run_id, b'{"amount": {"cents": ' + number(n) + b"}}")
    answer = await api.post(
        "/events", content=body, headers={**headers, "authorization": f"Bearer {TOKEN}"}
    )
    assert answer.status_code == 400, answer.text
    named(answer, f"{where}.amount.cents", n)
    assert await signals(rt, run_id) == 0


@pytest.mark.parametrize("encode", ENCODINGS, ids=["structured", "batch", "binary"])
async def test_an_event_with_two_to_the_63_arrives_exact(
    rt: Runtime, api: httpx.AsyncClient, encode: Any
) -> None:
    run_id = await waiting(rt)
    headers, body, _ = encode(run_id, b'{"cents": ' + number(EXACT) + b"}")
    answer = await api.post(
        "/events", content=body, headers={**headers, "authorization": f"Bearer {TOKEN}"}
    )
    assert answer.status_code == 202, answer.text
    assert (await output(api, rt, run_id))["signal"]["data"] == {"cents": EXACT}


@pytest.mark.parametrize("n", TOO_BIG)
def test_a_cli_json_option_out_of_range_is_a_usage_error(
    n: int, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(typer.Exit) as caught:
        parse_json_option('{"a": [' + str(n) + "]}", "--input")
    assert caught.value.exit_code == 2
    error = capsys.readouterr().err
    assert "--input at a[0]" in error and str(n) in error and "2**64-1" in error


def test_a_cli_json_option_keeps_two_to_the_63_exact() -> None:
    assert parse_json_option('{"a": ' + str(EXACT) + "}", "--input") == {"a": EXACT}
