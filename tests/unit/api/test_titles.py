"""A definition's `title:` is shown wherever its name is: the API's definition rows, run
rows, run views, graphs and run streams, and the `HttpClient` that reads them (on SQLite
and PostgreSQL: the title is read back from the stored definition)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from tideflow.api import create_app
from tideflow.api.serving import address_of, http_api, listen
from tideflow.lifecycle import Stop
from tideflow.model.plan import Plan
from tideflow.remote_http import HttpClient
from tideflow.runtime.runtime import Runtime

TITLE = "订单履约流程"
TITLED = {
    "name": "order-fulfillment",
    "title": TITLE,
    "version": "1",
    "steps": [{"id": "a", "type": "noop"}],
}
PLAIN = {"name": "plain", "version": "1", "steps": [{"id": "a", "type": "noop"}]}


@pytest.fixture(params=["sqlite", "postgres"])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'titles.db'}"
        return
    postgres_url = request.getfixturevalue("postgres_url")
    schema = f"titles_{uuid.uuid4().hex[:12]}"
    yield f"{postgres_url}?schema={schema}"
    conn = await asyncpg.connect(postgres_url)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


@pytest.fixture
async def rt(store_url: str) -> AsyncIterator[Runtime]:
    async with Runtime(store=store_url, workers=1) as runtime:
        await runtime.client.register(TITLED)
        await runtime.client.register(PLAIN)
        yield runtime


async def finished(rt: Runtime, workflow: str) -> str:
    run_id, _ = await rt.client.launch(workflow, None)
    assert (await rt.client.wait(run_id, 30)).status == "succeeded"
    return run_id


async def test_every_view_of_the_api_shows_the_title(rt: Runtime) -> None:
    titled, plain = await finished(rt, "order-fulfillment"), await finished(rt, "plain")
    transport = httpx.ASGITransport(app=create_app(rt.client, auth=False))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as api:
        definitions = (await api.get("/definitions")).json()["definitions"]
        runs = (await api.get("/runs")).json()["runs"]
        views = {
            path: (await api.get(path)).json()
            for path in (
                f"/runs/{titled}",
                f"/runs/{titled}/state",
                f"/runs/{titled}/graph",
                "/definitions/order-fulfillment/1",
                "/definitions/order-fulfillment/1/graph",
            )
        }
        plain_view = (await api.get(f"/runs/{plain}")).json()
        stream = await api.get("/streams/runs", params={"max_events": 1})
        registered = await api.post("/definitions", json={**TITLED, "version": "2"})
    assert {(d["name"], d["title"]) for d in definitions} == {
        ("order-fulfillment", TITLE),
        ("plain", None),
    }
    assert {(r["run_id"], r["workflow"], r["title"]) for r in runs} == {
        (titled, "order-fulfillment", TITLE),
        (plain, "plain", None),
    }
    assert {path: view["title"] for path, view in views.items()} == dict.fromkeys(views, TITLE)
    assert plain_view["title"] is None
    assert TITLE in stream.text  # the run list stream sends its rows with their titles
    assert (registered.status_code, registered.json()["title"]) == (201, TITLE)


async def test_the_http_client_reads_the_titles(rt: Runtime) -> None:
    titled = await finished(rt, "order-fulfillment")
    sock = listen("127.0.0.1", 0)
    async with http_api(rt.client, Stop(), sock, auth=False), HttpClient(address_of(sock)) as c:
        definitions = {d.name: d.title for d in await c.definitions()}
        (row,) = (await c.list()).runs
        summary = await c.summary(titled)
        definition = await c.definition("order-fulfillment")
    assert definitions == {"order-fulfillment": TITLE, "plain": None}
    assert (row.run_id, row.title, summary.title, definition.title) == (titled, TITLE, TITLE, TITLE)


async def test_a_run_list_reads_each_definition_version_once(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    await finished(rt, "order-fulfillment")
    store, reads = rt.client.store, []
    definition = store.get_definition

    async def counted(name: str, version: str | None = None) -> Plan:
        reads.append((name, version))
        return await definition(name, version)

    async def titles() -> list[str | None]:
        with monkeypatch.context() as patch:
            patch.setattr(store, "get_definition", counted)
            return [r.title for r in (await rt.client.list()).runs]

    assert [await titles() for _ in range(3)] == [[TITLE]] * 3
    await finished(rt, "plain")
    assert [await titles() for _ in range(2)] == [[None, TITLE]] * 2
    assert (await rt.client.summary((await rt.client.list()).runs[0].run_id)).title is None
    # once per (workflow, version): a registered version never changes
    assert reads == [("order-fulfillment", "1"), ("plain", "1")]
