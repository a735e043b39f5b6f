"""A secret value never reaches a durable store, the logs, or what the CLI/API returns.

The run below sends the secret in a header and in a URL; both the success path
(the echoed header) and the failure path (an error message with the URL) are
exercised. Then every byte of the SQLite file (and its WAL) and every row of every
PostgreSQL table is searched for the secret.
"""

from __future__ import annotations

import logging
import sqlite3
import uuid
from pathlib import Path

import asyncpg
import orjson
import pytest

from tideflow import Runtime
from tideflow.store.backends.postgres import PostgresStore, quote_ident
from tideflow.worker.secrets import EnvSecretProvider

from .conftest import LocalServer

SECRET = "tok-5e4d3c2b1a09"


def _flow(url: str) -> str:
    return f"""
name: secret-in-store
version: "1"
steps:
  - id: call
    type: http
    url: "{url}/echo"
    headers: {{Authorization: "Bearer {{{{ secrets.API_TOKEN }}}}"}}
  - id: fail
    type: http
    depends_on: [call]
    on_error: continue
    url: "{url}/status/400?token={{{{ secrets.API_TOKEN }}}}"
output: "{{{{ steps.call.output.body.headers }}}}"
"""


async def _run(store: object, url: str) -> dict[str, object]:
    secrets = EnvSecretProvider({"TIDEFLOW_SECRET_API_TOKEN": SECRET})
    async with Runtime(store=store, secrets=secrets) as rt:  # type: ignore[arg-type]
        result = await rt.run(await rt.register(_flow(url)), {})
        assert result.status == "succeeded", result.error
        assert (
            result.steps["call"].output["body"]["headers"]["authorization"] == "***"
        )  # a credential key: masked whole (model/masking.py)
        history = await rt.history(result.run_id)
        return {"result": result.to_dict(), "history": [e.to_dict() for e in history]}


async def test_secret_never_in_sqlite(
    http_server: LocalServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    db = tmp_path / "secrets.db"
    seen = await _run(f"sqlite:///{db}", http_server.url)
    assert http_server.state.requests[0]["headers"]["authorization"] == f"Bearer {SECRET}"
    files = [p for p in tmp_path.iterdir() if p.name.startswith("secrets.db")]
    assert files
    for path in files:
        assert SECRET.encode() not in path.read_bytes(), path
    conn = sqlite3.connect(db)
    try:
        dump = "\n".join(conn.iterdump())
    finally:
        conn.close()
    assert "secret-in-store" in dump  # the dump really holds the run
    assert SECRET not in dump
    assert SECRET.encode() not in orjson.dumps(seen)
    assert SECRET not in caplog.text


async def test_secret_never_in_postgres(
    http_server: LocalServer, postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    schema = f"secrets_{uuid.uuid4().hex[:12]}"
    store = PostgresStore(postgres_url, schema=schema)
    try:
        seen = await _run(store, http_server.url)
        conn = await asyncpg.connect(postgres_url)
        try:
            tables = await conn.fetch(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = $1", schema
            )
            dump = []
            for row in tables:
                name = f"{quote_ident(schema)}.{quote_ident(row['table_name'])}"
                dump += [str(dict(r)) for r in await conn.fetch(f"SELECT * FROM {name}")]
        finally:
            await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE")
            await conn.close()
    finally:
        await store.close()
    text = "\n".join(dump)
    assert "secret-in-store" in text
    assert SECRET not in text
    assert SECRET.encode() not in orjson.dumps(seen)
    assert SECRET not in caplog.text
