"""PostgreSQL's ``tideflow_commit`` (migrations 0004 and 0013): what its set-based
statements keep of the row-by-row function's behaviour, the document an engine started
before migration 13 still sends, and a store upgraded to it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tideflow.model.events import SignalReceived
from tideflow.model.states import RunStatus
from tideflow.store.base import AppliedEvent, ConcurrencyConflict

from .conftest import Backend
from .scenarios import T0, Driver, order_plan, order_script

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.parametrize("sql_backend", ["postgres"], indirect=True),
]

MIGRATIONS = Path(__file__).parents[2] / "src" / "tideflow" / "store" / "sql" / "postgres"


@pytest.fixture
def pg(sql_backend: Backend) -> Backend:
    return sql_backend


def signal(driver: Driver, run_id: str, seq: int) -> AppliedEvent:
    event = SignalReceived(event_id=f"late-{run_id}-{seq}", run_id=run_id, time=T0 + 50, name="x")
    h = driver.harnesses[run_id]
    return AppliedEvent(event=event, state=h.state, transitions=[], commands=[], seq=seq)


async def test_the_first_stale_run_by_id_is_named_with_the_count_of_others(pg: Backend) -> None:
    """The runs are advanced by one UPDATE; the runs it left out are stale, and the error
    names the first of them in run id order (the document's), whatever the batch's order,
    and counts the others. Nothing of the batch is written."""
    store = await pg.open()
    driver = Driver(store)
    for run_id in ("a", "b", "c", "d"):
        h = await driver.new_run(order_plan(), run_id)
        await driver.play(order_script(h)[:1])
    before = {run_id: await store.history(run_id) for run_id in "abcd"}
    batch = [
        signal(driver, "d", driver.seqs["d"] + 1),
        signal(driver, "c", driver.seqs["c"]),  # stale: another applier wrote this seq
        signal(driver, "a", driver.seqs["a"] + 1),
        signal(driver, "b", driver.seqs["b"]),  # stale
    ]
    with pytest.raises(
        ConcurrencyConflict, match=r"^run b \(and 1 more\) was advanced by another applier$"
    ):
        await store.commit(batch)
    for run_id, entries in before.items():
        assert await store.history(run_id) == entries
        assert (await store.load_run(run_id)).last_seq == driver.seqs[run_id]
    await store.commit([batch[0], batch[2]])
    assert [(await store.load_run(r)).last_seq for r in "ad"] == [
        driver.seqs["a"] + 1,
        driver.seqs["d"] + 1,
    ]


async def test_a_snapshot_is_written_with_its_run_and_from_an_older_document(
    pg: Backend,
) -> None:
    """A run's snapshot travels in its row of the document and is written by the same
    UPDATE; a ``snapshots`` key (the document of an engine started before migration 13)
    is still written."""
    assert pg.raw is not None
    store = await pg.open()
    driver = Driver(store, snapshot_every=1)
    h = await driver.new_run(order_plan(), "snap")
    await driver.play(order_script(h)[:2])
    rows = await pg.raw("SELECT last_seq, snapshot_seq FROM runs WHERE run_id = 'snap'")
    assert tuple(rows[0]) == (driver.seqs["snap"], driver.seqs["snap"])
    seq = driver.seqs["snap"]
    older = {
        "runs": [["snap", "running", T0 + 60, None, None, None, seq + 1, seq]],
        "snapshots": [["snap", seq + 1, '{"older": true}']],
    }
    await pg.raw(f"SELECT tideflow_commit('{json.dumps(older)}'::jsonb)")
    rows = await pg.raw("SELECT last_seq, snapshot_seq, snapshot FROM runs WHERE run_id = 'snap'")
    assert tuple(rows[0]) == (seq + 1, seq + 1, '{"older": true}')


async def test_a_store_at_schema_12_gets_the_set_based_commit(pg: Backend) -> None:
    """Upgraded from schema 12 (migration 4's function), a store has the function of
    migration 13, with the settings that keep its plans key lookups, and commits."""
    await pg.open()
    old = (MIGRATIONS / "0004_commit_function.sql").read_text(encoding="utf-8")
    function = old[old.index("CREATE FUNCTION") :].replace(
        "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1
    )
    await pg.close_all()
    settings = (
        "SELECT proconfig FROM pg_proc WHERE proname = 'tideflow_commit'"
        " AND pronamespace = current_schema()::regnamespace"
    )
    store = await pg.upgraded_from(12, [function])
    assert pg.raw is not None
    assert sorted((await pg.raw(settings))[0][0]) == [
        "enable_hashjoin=off",
        "enable_mergejoin=off",
        "enable_seqscan=off",
    ]
    driver = Driver(store)
    h = await driver.new_run(order_plan(), "upgraded")
    await driver.play(order_script(h))
    assert (await store.get_run("upgraded")).status == RunStatus.SUCCEEDED
