"""Every query an engine, its sweep and a client issue reaches the rows that grow with
the runs through an index: none reads a table of runs, history, timers, waits, tasks,
outbox or inbox rows whole (or a whole index of one), so each stays O(log n) at 10
million history rows.

PostgreSQL: not a list of queries that could drift from the code. The growing tables are
filled (50,000 runs, 200,000 history rows, 200,000 waits and timers) and analysed; then a
real runtime (engine, sweep, workers, client; then a second engine's recovery) works on
the store while its connections log the plan of every statement they run, those inside
``tideflow_commit`` included (``auto_explain`` with nested statements, analysed, with
buffers, sent to the client as LOG messages). A scan of a growing table fails the test
when it touched more than a quarter of the pages of the table or index it scanned: a
sequential scan does, and so does an index scan on a column that is not the index's
first (no better than a sequential scan). A second run makes ``tideflow_commit``'s plans
while the tables are empty, then fills them under it: the plans a connection keeps must
stay key lookups.

SQLite: every named query and the run listings, by ``EXPLAIN QUERY PLAN``: no ``SCAN``
of a growing table without an index (the queries allowed to, none on a hot path, say why).
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest

from tideflow.dsl import compile_definition
from tideflow.runtime.runtime import Runtime
from tideflow.store.backends.postgres import PostgresStore
from tideflow.store.backends.sqlite import SqliteStore
from tideflow.store.base import RunFilter
from tideflow.store.sqlbase import list_runs_query
from tideflow.store.sqlfiles import queries
from tideflow.testing.waiting import step_is, wait_until

from .conftest import compile_stored, drop_schema

pytestmark = [
    pytest.mark.timeout(120),
    # the listener is meant to stay on the pooled connections (the store keeps sessions)
    pytest.mark.filterwarnings("ignore:.*active log listener:asyncpg.InterfaceWarning"),
]

GROWING = frozenset(
    {
        "runs",
        "history",
        "outbox",
        "timers",
        "task_leases",
        "waits",
        "inbox",
        "unindexed_runs",
        "gateway_events",
        "gateway_event_rows",
    }
)
"""Tables whose rows grow with the runs (the others hold definitions, tokens, schedules,
leases: rows per thing an operator made, not per run)."""
RECOVERY_ONLY = {
    "task_leases": "lease_until <",
}
"""A scan an engine makes once when it starts, of a table bounded by the attempts in
flight (migration 0008 dropped its index: every commit paid for it)."""

CHILD = {"name": "child", "version": "1", "steps": [{"id": "c", "type": "noop"}]}
FLOW = {
    "name": "hot",
    "version": "1",
    "steps": [
        {"id": "a", "type": "noop"},
        {"id": "nap", "type": "sleep", "duration": "50ms", "depends_on": ["a"]},
        {"id": "ask", "type": "wait", "signal": "go", "depends_on": ["nap"]},
        {"id": "sub", "type": "subflow", "workflow": "child", "depends_on": ["ask"]},
        {"id": "z", "type": "noop", "depends_on": ["sub"]},
    ],
}


def scans(plan: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(node type, relation) of every node of a plan that reads a relation."""
    if "Relation Name" in plan:
        yield plan["Node Type"], plan["Relation Name"]
    for child in plan.get("Plans", ()):
        yield from scans(child)


class Plans:
    """The plans the store's connections log (auto_explain, as LOG messages)."""

    SETTINGS = {
        "session_preload_libraries": "auto_explain",
        "auto_explain.log_min_duration": "0",
        "auto_explain.log_nested_statements": "on",
        "auto_explain.log_format": "json",
        "auto_explain.log_analyze": "on",
        "auto_explain.log_buffers": "on",
        "auto_explain.log_timing": "off",
        "client_min_messages": "log",
    }

    def __init__(self) -> None:
        self.logged: list[tuple[str, dict[str, Any]]] = []
        self.sizes: dict[str, int] = {}
        """Pages of each table and index, once filled."""

    def heard(self, conn: Any, message: Any) -> None:
        text = str(message.message)
        if "plan:" not in text:
            return
        plan = json.loads(text.split("plan:", 1)[1])
        self.logged.append((plan["Query Text"], plan["Plan"]))

    async def setup(self, conn: Any) -> None:
        conn.add_log_listener(self.heard)

    def full_scans(self) -> list[tuple[str, str, float]]:
        """(table, statement, share of the table or index read) of each scan that read a
        large part of what it scanned."""
        found = []
        for query, plan in self.logged:
            for node in nodes(plan):
                relation = growing(node)
                if relation is None or RECOVERY_ONLY.get(relation, "\0") in query:
                    continue
                size = self.sizes.get(node.get("Index Name") or node.get("Relation Name", ""))
                if size and size >= FILLED and pages(node) > WHOLE * size:
                    found.append(
                        (relation, " ".join(query.split())[:200], round(pages(node) / size, 2))
                    )
        return found


FILLED = 100
"""Pages from which a table or index counts as filled (the others hold a few rows here,
which any plan reads in a page or two: this test says nothing of them)."""
WHOLE = 0.25
"""A scan that touches more than this share of the pages of its table (or index) reads it
whole, near enough: a batch of lookups touches a few pages per key, a few percent of the
filled tables; a sequential scan, or an index scan on a column that is not the index's
first, touches all of them."""


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from nodes(child)


def growing(node: dict[str, Any]) -> str | None:
    """The growing table a scan node reads (by its relation, or its index's name)."""
    if "Scan" not in node["Node Type"]:
        return None
    if node.get("Relation Name") in GROWING:
        return str(node["Relation Name"])
    index = node.get("Index Name", "")
    return next((t for t in GROWING if index.startswith(t + "_")), None)


def pages(node: dict[str, Any]) -> float:
    touched = node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)
    return float(touched) / max(1.0, float(node.get("Actual Loops", 1)))


FILL = [
    "INSERT INTO runs (run_id, workflow, version, plan_hash, status, created_at, updated_at,"
    " finished_at, last_seq, snapshot_seq, snapshot)"
    " SELECT 'f' || i, 'filler', '1', 'none', 'succeeded', i, i, i, 4, 4, '{}'"
    " FROM generate_series(1, 50000) AS i",
    "INSERT INTO history (run_id, seq, event_id, kind, time, data, transitions)"
    " SELECT 'f' || r, s, 'f' || r || ':' || s, 'filler', r, '{}', '[]'"
    " FROM generate_series(1, 50000) AS r, generate_series(1, 4) AS s",
    "INSERT INTO waits (signal, run_id) SELECT 'filler' || i, 'f' || (i % 50000)"
    " FROM generate_series(1, 200000) AS i",
    "INSERT INTO timers (run_id, timer_id, fire_at) SELECT 'f' || (i % 50000), 't' || i, 1e12"
    " FROM generate_series(1, 200000) AS i",
    "ANALYZE",
]
"""Ended runs and their rows, as a long-lived store holds them (the timers far ahead)."""


FILL_TASKS = (
    "INSERT INTO task_leases (run_id, step_key, attempt, dispatched_at, started_at, owner,"
    " lease_until) SELECT 'f' || i, 's', 1, i, i, NULL, 0 FROM generate_series(1, 50000) AS i"
)
"""Attempts in flight of the filler runs (the test that fills the tables under a live
runtime: the statements that end and start attempts look rows up among these)."""


async def fill(plans: Plans, conn: Any, schema: str, statements: list[str]) -> None:
    """Fill the growing tables and note the pages of each table and index."""
    for statement in statements:
        await conn.execute(statement)
    plans.sizes = {
        str(name): int(count)
        for name, count in await conn.fetch(
            "SELECT relname, pg_relation_size(oid) / 8192 FROM pg_class"
            " WHERE relnamespace = $1::regnamespace AND relkind IN ('r', 'i')",
            schema,
        )
    }


@pytest.fixture
async def logged(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The plans every pool's connections log, a new schema, and a maker of stores on it."""
    plans = Plans()
    real = asyncpg.create_pool

    def create_pool(*args: Any, **kwargs: Any) -> Any:
        kwargs["server_settings"] = {**kwargs.get("server_settings", {}), **Plans.SETTINGS}
        kwargs["setup"] = plans.setup  # on each acquire: a release drops log listeners
        return real(*args, **kwargs)

    monkeypatch.setattr(asyncpg, "create_pool", create_pool)
    schema = f"hot_{uuid.uuid4().hex[:16]}"

    def make_store(**options: Any) -> PostgresStore:
        return PostgresStore(postgres_url, schema=schema, compile_plan=compile_stored, **options)

    try:
        yield plans, make_store, schema, postgres_url
    finally:
        await drop_schema(postgres_url, schema)


@pytest.fixture
async def explained(logged: Any) -> Any:
    plans, make_store, schema, _ = logged
    filled = make_store()
    await filled.open()
    try:
        async with filled.pool.acquire() as conn:
            await fill(plans, conn, schema, FILL)
    finally:
        await filled.close()
    plans.logged.clear()
    return plans, make_store


async def test_no_hot_query_reads_a_growing_table_whole(explained: Any) -> None:
    plans, make_store = explained
    flow, child = compile_definition(FLOW), compile_definition(CHILD)
    async with Runtime(store=make_store(), workers=4, sweep_interval=0.1) as rt:
        client = rt.client
        await client.register(child)
        await client.register(flow)
        ids = await asyncio.gather(
            *(client.start("hot", {"i": i}, idempotency_key=f"k{i}") for i in range(20))
        )
        assert await client.start("hot", {"i": 0}, idempotency_key="k0") == ids[0]
        for run_id in ids:
            await wait_until(rt, run_id, step_is("ask", "waiting"), timeout=30)
        await client.deliver_event("go", {"ok": True}, event_id="go-1")
        for run_id in ids:
            assert (await client.wait(run_id, 30)).status == "succeeded"
        await client.get(ids[0])
        await client.history(ids[0])
        await client.list(RunFilter(status="succeeded"), limit=5)
        await client.list(RunFilter(workflow="hot", status="pending"), limit=5)
        waiting = await client.start("hot", {"i": 99})
        await wait_until(rt, waiting, step_is("ask", "waiting"), timeout=30)
        await asyncio.sleep(0.3)  # a few sweep rounds
    # a second engine starts on the same store: recovery's reads
    async with Runtime(store=make_store(), workers=2, sweep_interval=0.1) as rt:
        await rt.client.signal(waiting, "go", {"ok": True})
        assert (await rt.client.wait(waiting, 30)).status == "succeeded"
    statements = {query for query, _ in plans.logged}
    assert any("tideflow_commit" in q for q in statements)  # the commit was seen...
    assert any("UPDATE runs" in q for q in statements)  # ...and inside it
    assert plans.full_scans() == []


async def test_a_statement_no_index_serves_is_caught(explained: Any) -> None:
    """The check above can fail: without the index on ``waits.run_id`` (migration 0002),
    the statement that forgets a run's waits reads the table (or its primary key, which
    starts with the signal) whole."""
    plans, make_store = explained
    store = make_store()
    await store.open()
    try:
        async with store.pool.acquire() as conn:
            await conn.execute("DROP INDEX waits_run")
            await conn.execute("DELETE FROM waits WHERE run_id = ANY($1::text[])", ["r1"])
    finally:
        await store.close()
    assert [relation for relation, *_ in plans.full_scans()] == ["waits"]


LIVE = {
    "name": "live",
    "version": "1",
    "steps": [
        {"id": "a", "type": "noop"},
        {"id": "nap", "type": "sleep", "duration": "10ms", "depends_on": ["a"]},
        {"id": "b", "type": "noop", "depends_on": ["nap"]},
    ],
}


def in_commit(query: str) -> bool:
    """A statement of tideflow_commit's body (they read the batch's document)."""
    return "batch->" in query or "batch ?" in query


async def live_runs(rt: Runtime, count: int) -> None:
    ids = await asyncio.gather(*(rt.client.start("live", {}) for _ in range(count)))
    for run_id in ids:
        assert (await rt.client.wait(run_id, 30)).status == "succeeded"


async def test_commit_plans_made_on_empty_tables_stay_key_lookups(logged: Any) -> None:
    """PL/pgSQL plans tideflow_commit's statements on a connection's first calls and,
    after five, keeps a generic plan for the connection's life. Here they are made while
    every table is empty; then the tables grow under the live runtime, without an
    ANALYZE (which would have the plans made again), and the next commits, on the same
    connections, must still look each row of the batch up by its key (migration 0013
    turns hash joins, merge joins and sequential scans off for the function; without
    those settings its runs UPDATE, a hash join, read the whole of `runs` here)."""
    plans, make_store, schema, url = logged
    async with Runtime(store=make_store(max_size=2), workers=4, sweep_interval=0.1) as rt:
        await rt.client.register(compile_definition(LIVE))
        for _ in range(30):  # rounds, until the two connections made 30 commits of runs
            await live_runs(rt, 5)
            if sum(in_commit(q) and "UPDATE runs" in q for q, _ in plans.logged) >= 30:
                break
        else:
            raise AssertionError("fewer than 30 commits in 30 rounds")
        conn = await asyncpg.connect(url, server_settings={"search_path": schema})
        try:
            await fill(plans, conn, schema, [*FILL[:-1], FILL_TASKS])
        finally:
            await conn.close()
        plans.logged.clear()
        await live_runs(rt, 20)
    statements = {query for query, _ in plans.logged if in_commit(query)}
    assert any("UPDATE runs" in q for q in statements)
    assert any("DELETE FROM task_leases" in q for q in statements)
    assert plans.full_scans() == []


# -- SQLite: every named query, by its plan ----------------------------------------

NOT_HOT_SQLITE = {
    "delete_run_outbox": "`tideflow db prune` only; the outbox holds what is not relayed yet",
    "expired_tasks": "once when an engine starts; bounded by the attempts in flight",
    "prune_gateway_event_rows": "`tideflow db prune` only",
    "prune_gateway_events": "`tideflow db prune` only",
}
"""Named queries allowed to read a growing table whole, and why (none is on a hot path)."""
LISTINGS = [
    RunFilter(),
    RunFilter(status="pending"),
    RunFilter(status="pending", created_before=1.0),
    RunFilter(workflow="w"),
    RunFilter(workflow="w", status="running", created_after=1.0),
]
"""The run listings the sweep, recovery, the CLI and the API ask for."""


def test_no_sqlite_query_reads_a_growing_table_whole(tmp_path: Path) -> None:
    path = tmp_path / "store.db"

    async def create() -> None:
        store = SqliteStore(f"sqlite:///{path}")
        await store.open()
        await store.close()

    asyncio.run(create())
    statements = dict(queries("sqlite"))
    for i, f in enumerate(LISTINGS):
        statements[f"list_runs {i}"] = list_runs_query(f, 10, None, lambda n: "?")[0]
    conn = sqlite3.connect(path)
    try:
        full: dict[str, list[str]] = {}
        for name, sql in statements.items():
            if name in NOT_HOT_SQLITE or not sql.lstrip().upper().startswith(
                ("SELECT", "INSERT", "UPDATE", "DELETE", "WITH")
            ):
                continue
            params = [None] * len(re.findall(r"\?", sql))
            plan = conn.execute(f"EXPLAIN QUERY PLAN {sql}", params).fetchall()
            scans = [
                detail
                for *_, detail in plan
                if re.match(r"SCAN (\w+)", detail)
                and re.match(r"SCAN (\w+)", detail).group(1) in GROWING  # type: ignore[union-attr]
                and "USING" not in detail
            ]
            if scans:
                full[name] = scans
    finally:
        conn.close()
    assert full == {}
    assert set(NOT_HOT_SQLITE) <= set(statements)  # the allowed ones still exist
