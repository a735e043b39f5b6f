"""`/openapi.json` describes every route: a request-body schema for each that takes a
body, a response schema for each, and the problem shape for its errors."""

from __future__ import annotations

from typing import Any

import httpx

from tideflow.api import create_app
from tideflow.api.run_views import SSE_EVENT
from tideflow.runtime.runtime import Runtime

PROBLEM = {"$ref": "#/components/schemas/Problem"}
TAKES_A_BODY = {
    ("post", "/definitions/validate"),
    ("post", "/definitions"),
    ("post", "/runs"),
    ("post", "/runs/{run_id}/cancel"),
    ("post", "/runs/{run_id}/retry"),
    ("post", "/runs/{run_id}/signals"),
    ("post", "/events"),
    ("post", "/schedules"),
}


async def openapi() -> dict[str, Any]:
    async with Runtime(workers=0) as rt:
        transport = httpx.ASGITransport(app=create_app(rt.client))
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as api:
            response = await api.get("/openapi.json")
    assert response.status_code == 200
    document: dict[str, Any] = response.json()
    return document


async def test_every_route_has_its_schemas() -> None:
    document = await openapi()
    operations = {
        (method, path): operation
        for path, item in document["paths"].items()
        for method, operation in item.items()
    }
    assert {path for _, path in operations} == {
        "/health",
        "/ready",
        "/queues",
        "/workers",
        "/metrics",
        "/definitions/validate",
        "/definitions",
        "/definitions/{name}/{version}",
        "/definitions/{name}/{version}/activate",
        "/definitions/{name}/{version}/deactivate",
        "/runs",
        "/runs/{run_id}",
        "/runs/{run_id}/history",
        "/runs/{run_id}/why",
        "/runs/{run_id}/cancel",
        "/runs/{run_id}/retry",
        "/runs/{run_id}/signals",
        "/schedules",
        "/schedules/{workflow}/{schedule_id}",
        "/schedules/{workflow}/{schedule_id}/pause",
        "/schedules/{workflow}/{schedule_id}/resume",
        "/schedules/{workflow}/{schedule_id}/trigger",
        "/runs/{run_id}/state",
        "/runs/{run_id}/graph",
        "/runs/{run_id}/steps/{step_id}",
        "/runs/{run_id}/attempts",
        "/runs/{run_id}/logs",
        "/definitions/{name}/{version}/graph",
        "/streams/runs/{run_id}",
        "/streams/runs",
        "/events",
        "/events/unmatched",
        "/events/unmatched/{key}/replay",
    }
    assert {key for key, op in operations.items() if "requestBody" in op} == TAKES_A_BODY
    for key, operation in operations.items():
        if key in TAKES_A_BODY:
            content = operation["requestBody"]["content"]
            assert all("schema" in media for media in content.values()), key
        ok = [code for code in operation["responses"] if code.startswith("2")]
        assert len(ok) == 1, key
        content = operation["responses"][ok[0]]["content"]
        if key == ("get", "/metrics"):  # Prometheus's text format, not JSON
            assert content == {"text/plain": {"schema": {"type": "string"}}}, key
        elif key[1].startswith("/streams/"):  # server-sent events (api/run_views.py)
            assert content == {"text/event-stream": {"schema": SSE_EVENT}}, key
        else:
            assert "$ref" in content["application/json"]["schema"], key
        for code in ("404", "422", "503"):
            error = operation["responses"][code]["content"]
            assert error == {"application/problem+json": {"schema": PROBLEM}}, (key, code)


async def test_a_definition_may_be_json_or_yaml() -> None:
    document = await openapi()
    body = document["paths"]["/definitions"]["post"]["requestBody"]["content"]
    assert set(body) == {"application/json", "application/yaml"}


async def test_security_is_declared_on_every_route_but_the_probes() -> None:
    document = await openapi()
    scheme = document["components"]["securitySchemes"]["bearer"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if path == "/events":  # its sources' own credentials: the next test
                continue
            if path in ("/health", "/ready"):
                assert "security" not in operation, path
                assert not {"401", "403"} & set(operation["responses"]), path
                continue
            assert operation["security"] == [{"bearer": []}], (method, path)
            for code in ("401", "403"):
                error = operation["responses"][code]["content"]
                assert error == {"application/problem+json": {"schema": PROBLEM}}, (path, code)
            assert "WWW-Authenticate" in operation["responses"]["401"]["headers"], path


async def test_the_event_gateway_documents_its_modes_outcomes_and_refusals() -> None:
    document = await openapi()
    operation = document["paths"]["/events"]["post"]
    body = operation["requestBody"]["content"]
    assert set(body) == {
        "application/cloudevents+json",
        "application/cloudevents-batch+json",
        "*/*",
    }
    event = {"$ref": "#/components/schemas/CloudEventJSON"}
    assert body["application/cloudevents+json"]["schema"] == event
    assert body["application/cloudevents-batch+json"]["schema"]["items"] == event
    schemas = document["components"]["schemas"]
    assert schemas["CloudEventJSON"]["required"] == ["id", "source", "specversion", "type"]
    accepted = operation["responses"]["202"]["content"]["application/json"]["schema"]
    assert accepted == {"$ref": "#/components/schemas/EventsAccepted"}
    outcome = schemas["EventOutcome"]["properties"]["status"]
    assert set(outcome["enum"]) == {"delivered", "buffered", "unmatched", "duplicate"}
    for code in ("400", "401", "403", "413", "415"):
        error = operation["responses"][code]["content"]
        assert error == {"application/problem+json": {"schema": PROBLEM}}, code
