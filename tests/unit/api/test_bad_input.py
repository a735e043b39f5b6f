"""Bad input through the HTTP API is a 4xx that says what to change, never a 500: deep
nesting (100,000 '[' in a JSON body, a definition, an event, a UI login; a YAML
definition 900 levels deep), a 100,000-'-' expression, non-finite times in a query, a
cursor that decodes to NaN. Each request also changes nothing."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator

import httpx
import pytest

from tideflow.api import create_app
from tideflow.api.auth import issue_token
from tideflow.api.event_sources import EventSources
from tideflow.model.tokens import Role
from tideflow.runtime.runtime import Runtime

HELLO = {"name": "hello", "version": "1", "steps": [{"id": "a", "type": "noop"}]}
JSON = {"content-type": "application/json"}
YAML = {"content-type": "application/yaml"}
DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.fixture
async def rt() -> AsyncIterator[Runtime]:
    async with Runtime(workers=1) as runtime:
        await runtime.register(HELLO)
        yield runtime


TOKEN = "desk-token-0123456789abcdef"
SOURCES = EventSources.of(
    {"sources": [{"source": "urn:desk", "auth": "bearer", "token_env": "DESK"}]},
    {"DESK": TOKEN},
)


@pytest.fixture
async def api(rt: Runtime) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(rt.client, auth=False, event_sources=SOURCES)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        yield client


def yaml_with_when(expression: str) -> bytes:
    text = f"name: w\nversion: '1'\nsteps:\n  - id: a\n    type: noop\n    when: '{expression}'\n"
    return text.encode()


@pytest.mark.parametrize("template", ["{{ %s }}", "${{ %s }}"])
async def test_a_100000_minus_expression_is_a_422_with_its_line_and_column(
    rt: Runtime, api: httpx.AsyncClient, template: str
) -> None:
    body = yaml_with_when(template % ("-" * 100_000 + "1"))
    answer = await api.post("/definitions", content=body, headers=YAML)
    assert answer.status_code == 422, answer.text
    (error,) = answer.json()["errors"]
    assert (error["field"], error["line"]) == ("body.steps[0].when", 6)
    assert error["column"] >= 11
    assert [d.name for d in await rt.client.definitions()] == ["hello"]


async def test_a_yaml_definition_900_levels_deep_is_a_422_at_its_position(
    api: httpx.AsyncClient,
) -> None:
    body = b"name: " + b"[" * 900 + b"]" * 900
    answer = await api.post("/definitions/validate", content=body, headers=YAML)
    assert answer.status_code == 422, answer.text
    (error,) = answer.json()["errors"]
    assert "nested too deeply" in error["message"] and error["line"] == 1


@pytest.mark.parametrize("levels", [900, 100_000])
async def test_a_json_definition_nested_too_deeply_is_a_4xx(
    api: httpx.AsyncClient, levels: int
) -> None:
    body = b'{"name": ' + b"[" * levels + b"]" * levels + b"}"
    answer = await api.post("/definitions/validate", content=body, headers=JSON)
    assert answer.status_code in (400, 422), answer.text
    assert "nested too deeply" in answer.text or "depth limit" in answer.text


async def test_a_run_body_nested_100000_deep_is_a_400_that_says_so(
    rt: Runtime, api: httpx.AsyncClient
) -> None:
    body = b'{"workflow": "hello", "input": ' + DEEP + b"}"
    answer = await api.post("/runs", content=body, headers=JSON)
    assert answer.status_code == 400, answer.text
    assert "nested too deeply" in answer.json()["detail"]
    assert (await rt.client.list()).runs == []


async def test_a_run_input_300_deep_is_a_422_that_says_so(api: httpx.AsyncClient) -> None:
    body = b'{"workflow": "hello", "input": ' + b"[" * 300 + b"]" * 300 + b"}"
    answer = await api.post("/runs", content=body, headers=JSON)
    assert answer.status_code == 422, answer.text
    assert "nested more than 254 levels deep" in answer.json()["detail"]


async def test_a_ui_login_nested_100000_deep_is_refused_not_a_500(rt: Runtime) -> None:
    token = await issue_token(rt.client.store, name="ann", role=Role.VIEWER, now=0.0)
    transport = httpx.ASGITransport(app=create_app(rt.client), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        headers = {"x-tideflow-ui": "1"}
        answer = await client.post("/ui/login", content=DEEP, headers=headers)
        assert answer.status_code == 401 and "send" in answer.json()["detail"]
        fine = await client.post("/ui/login", json={"token": token.value}, headers=headers)
        assert fine.status_code == 200


@pytest.mark.parametrize("value", ["1e999", "-1e999", "nan", "inf"])
@pytest.mark.parametrize("name", ["created_after", "created_before"])
async def test_a_time_that_is_not_a_finite_number_is_a_422_naming_the_parameter(
    api: httpx.AsyncClient, name: str, value: str
) -> None:
    answer = await api.get("/runs", params={name: value})
    assert answer.status_code == 422, answer.text
    (error,) = answer.json()["errors"]
    assert error["field"] == f"query.{name}" and "finite" in error["message"]


@pytest.mark.parametrize("created", ["nan", "inf", "-inf", "1e999"])
async def test_a_cursor_that_holds_no_finite_time_is_a_bad_cursor(
    api: httpx.AsyncClient, created: str
) -> None:
    cursor = base64.urlsafe_b64encode(f"{created}|x".encode()).decode().rstrip("=")
    answer = await api.get("/runs", params={"cursor": cursor})
    assert answer.status_code == 422, answer.text
    assert answer.json()["errors"][0]["field"] == "query.cursor"


@pytest.mark.parametrize(
    ("levels", "words"),
    [(300, "nested more than 254 levels deep"), (100_000, "depth limit exceeded")],
)
async def test_event_data_nested_too_deeply_is_a_400_that_says_so(
    api: httpx.AsyncClient, levels: int, words: str
) -> None:
    body = (
        b'{"specversion": "1.0", "id": "e1", "source": "urn:desk", "type": "go", "data": '
        + b"[" * levels
        + b"]" * levels
        + b"}"
    )
    headers = {"content-type": "application/cloudevents+json", "authorization": f"Bearer {TOKEN}"}
    answer = await api.post("/events", content=body, headers=headers)
    assert answer.status_code == 400, answer.text
    assert words in answer.text and answer.json()["errors"][0]["field"] == "body"


@pytest.mark.parametrize(
    ("schedule", "field", "words"),
    [
        ({"every": 2**70}, "every", "longer than 100 years"),
        ({"every": 1e300}, "every", "longer than 100 years"),
        ({"every": "99999999999999999999d"}, "every", "longer than 100 years"),
        ({"every": 1e-300}, "every", "at least 1ms"),
        ({"every": "1h", "jitter": 2**70}, "jitter", "longer than 100 years"),
        ({"every": "1h", "start_at": 2**70}, "start_at", "to 9000"),
        ({"every": "1h", "start_at": "9999-06-01T00:00:00Z"}, "start_at", "to 9000"),
    ],
)
async def test_a_schedule_past_the_calendar_is_a_422_naming_the_field(
    api: httpx.AsyncClient, schedule: dict[str, object], field: str, words: str
) -> None:
    answer = await api.post(
        "/schedules", json={"workflow": "hello", "schedule": {"id": "s", **schedule}}
    )
    assert answer.status_code == 422, answer.text
    (error,) = answer.json()["errors"]
    assert error["field"] == f"body.schedule.{field}" and words in error["message"]
    assert (await api.get("/schedules")).json()["schedules"] == []


async def test_a_schedule_may_end_at_the_calendars_end(api: httpx.AsyncClient) -> None:
    schedule = {"id": "s", "cron": "0 6 * * *", "end_at": "9999-12-31T23:59:59Z"}
    answer = await api.post("/schedules", json={"workflow": "hello", "schedule": schedule})
    assert answer.status_code == 201, answer.text


@pytest.mark.parametrize("duration", [1e300, 2**62, "99999999999999999999d", "P9999999999W"])
async def test_a_step_duration_past_the_calendar_is_a_422(
    api: httpx.AsyncClient, duration: object
) -> None:
    definition = {
        "name": "long",
        "version": "1",
        "steps": [{"id": "nap", "type": "sleep", "duration": duration}],
    }
    answer = await api.post("/definitions", json=definition)
    assert answer.status_code == 422, answer.text
    (error,) = answer.json()["errors"]
    assert error["field"] == "body.steps[0].duration"
    assert "longer than 100 years" in error["message"]


@pytest.mark.parametrize(
    ("declared", "status"), [(b"1" * 5_000, 413), (b"0" * 5_000 + b"2", 422), (b"1e3", 400)]
)
async def test_a_content_length_of_thousands_of_digits_is_read_not_a_500(
    rt: Runtime, declared: bytes, status: int
) -> None:
    """Python reads no integer of more than 4,300 digits; the body limit compares lengths
    first (an ASGI server may pass such a header on)."""
    app = create_app(rt.client, auth=False)
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    headers = [(b"content-length", declared), (b"content-type", b"application/json")]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/runs",
        "raw_path": b"/runs",
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "server": ("api", 80),
        "client": ("caller", 1),
    }
    await app(scope, receive, send)
    assert sent[0]["status"] == status
