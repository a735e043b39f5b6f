"""The PostgreSQL store: the production backend, shared by every process of a cluster.

asyncpg with a connection pool; every statement is a named query of
``sql/postgres/queries.sql``, which asyncpg prepares once per connection and then
reuses. A commit is one statement, so one round trip whatever the size of the
batch: ``tideflow_commit`` (migration 0004) takes the batch as one JSON document of
row lists and, in the statement's implicit transaction, advances its runs (optimistic
check of each run's ``last_seq``, rows locked in run-id order), appends history,
saves snapshots, adds and deletes outbox rows and keeps the timer, task and wait
rows current. That is the group commit the runtime relies on.

Driver errors are translated here, at the boundary: a caller sees ``StoreError``
naming the server and database and what to check, never an asyncpg traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import math
import os
import socket
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import asyncpg  # type: ignore[import-untyped]

from tideflow.errors import NotFound, RunExists
from tideflow.model.plan import Plan
from tideflow.model.run import RunState
from tideflow.model.schedules import ScheduleRow
from tideflow.model.tokens import ApiToken
from tideflow.store import sqlbase as sb
from tideflow.store.backends.postgres_gateway import GatewayRecords
from tideflow.store.backends.postgres_inbox import DRIVER_ERRORS, LeaseAndInbox
from tideflow.store.backends.postgres_rows import (
    STALE_RUN,
    archive_runs,
    commit_document,
    write_index,
)
from tideflow.store.base import (
    AppliedEvent,
    Archive,
    ConcurrencyConflict,
    Created,
    DefinitionSummary,
    DueTimer,
    HistoryEntry,
    NewRun,
    OutboxItem,
    PendingRun,
    RunFilter,
    RunPage,
    RunSummary,
    Store,
    StoredRun,
    StoreError,
    StoreUnavailable,
    TaskLease,
    UnstorableData,
)
from tideflow.store.indexrows import IndexRows, index_rows, state_rows
from tideflow.store.sealing import Sealer
from tideflow.store.sqlfiles import latest_version, migrations, queries

Q = queries("postgres")
DIALECT = "postgres"

_CONFLICTS = (asyncpg.SerializationError, asyncpg.DeadlockDetectedError)
"""Two transactions raced for the same rows: the loser reloads and applies again."""
_DRIVER_ERRORS = DRIVER_ERRORS
"""Everything the driver raises (OSError covers refused connections and timeouts)."""
_UNAVAILABLE = (
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    asyncpg.PostgresConnectionError,
    asyncpg.OperatorInterventionError,
    asyncpg.InsufficientResourcesError,
)
"""The server is gone, shutting down, or out of connections, memory or disk, or no host
of the URL accepts writes now (a failover under way): try later."""
_BROKEN = (
    OSError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    asyncpg.PostgresConnectionError,
    asyncpg.OperatorInterventionError,
)
"""Errors after which a connection is not handed out again: the server went away or is
going (a failover), and asyncpg can leave the connection's protocol half-way through an
exchange (its next use fails with "cannot switch to state ...; another operation is in
progress"), which the pool's reset hook (``_keep_session``, no round trip) cannot see."""
_REFUSED_LOGIN = (asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError)


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def _keep_session(conn: Any) -> None:
    """Pool reset hook: the store leaves no session state behind (no SET, LISTEN,
    session locks or cursors; asyncpg still rolls back an open transaction), so a
    released connection needs no extra ``RESET ALL`` round trip."""


def application_name() -> str:
    """What ``pg_stat_activity.application_name`` says of this process's connections:
    ``tideflow/<pid>/<host>``, cut to PostgreSQL's 63 bytes (the pid first, so it stays)."""
    return f"tideflow/{os.getpid()}/{socket.gethostname()}"[:63]


class PostgresStore(LeaseAndInbox, GatewayRecords, Store):
    def __init__(
        self,
        url: str,
        *,
        auto_upgrade: bool = True,
        compile_plan: sb.PlanCompiler | None = None,
        schema: str | None = None,
        drop_schema_on_close: bool = False,
        min_size: int = 1,
        max_size: int = 10,
    ) -> None:
        self.url = url
        self.auto_upgrade = auto_upgrade
        self.compile_plan = compile_plan
        self.schema = schema
        self.drop_schema_on_close = drop_schema_on_close
        self.min_size = min_size
        self.max_size = max_size
        self.server, self.database, self.user = _describe(url)
        self.where = f"{self.server}/{self.database}" + (f" (schema {schema})" if schema else "")
        """Where the data lives, for messages (never the password)."""
        self._pool: Any = None
        self._listener: Any = None
        self._relistening: asyncio.Task[None] | None = None
        """The connection that LISTENs for inbox notifications (not pooled: it holds a LISTEN)."""
        self._plans: dict[str, Plan] = {}
        self._definitions: dict[tuple[str, str], str] = {}
        """(name, version) -> plan hash of definitions known to exist: they never change."""
        self.sealer = Sealer(where=f"the PostgreSQL store at {self.where}")
        """Seals the fields a run's plan declares sensitive (``tideflow.store.sealing``)."""

    # -- plumbing ---------------------------------------------------------------

    @property
    def pool(self) -> Any:
        if self._pool is None:
            raise StoreError("the store is not open: call `await store.open()` first")
        return self._pool

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Any]:
        """A pooled connection; driver errors raised while it is held become ours."""
        try:
            async with self.pool.acquire() as conn:
                try:
                    yield conn
                except _BROKEN:
                    # The pool connects afresh, to the primary of the moment. A connection
                    # the pool took back already when it closed refuses (InterfaceError).
                    with contextlib.suppress(asyncpg.InterfaceError):
                        conn.terminate()
                    raise
        except _CONFLICTS as exc:
            raise ConcurrencyConflict(
                f"PostgreSQL store {self.where}: {_one_line(exc)}; reload the runs and apply again"
            ) from None
        except _DRIVER_ERRORS as exc:
            raise self._translate(exc) from None

    def _translate(self, exc: BaseException) -> StoreError:
        if isinstance(exc, asyncpg.InvalidCatalogNameError):
            return StoreError(
                f"PostgreSQL at {self.server} has no database {self.database!r}: create it "
                f"(createdb {self.database}) or fix the database name in the store URL"
            )
        if isinstance(exc, _REFUSED_LOGIN):
            return StoreError(
                f"PostgreSQL at {self.server} refused user {self.user!r} for database "
                f"{self.database!r} ({_one_line(exc)}): check the user and password in the "
                "store URL and the server's pg_hba.conf"
            )
        if isinstance(exc, OSError) and "," in self.server:
            return StoreUnavailable(
                f"no host of PostgreSQL at {self.server} took a connection the store URL "
                f"accepts (the last one: {_one_line(exc)}): the primary is down or a "
                "failover is under way; check that one of them runs as the primary"
            )
        if isinstance(exc, OSError):
            return StoreUnavailable(
                f"cannot reach PostgreSQL at {self.server} ({_one_line(exc)}): check that the "
                "server is running and accepts TCP connections there, and the host and port "
                "in the store URL"
            )
        if isinstance(exc, asyncpg.TargetServerAttributeNotMatched):
            return StoreUnavailable(
                f"no server of PostgreSQL at {self.server} is what the store URL's "
                f"target_session_attrs asks for ({_one_line(exc)}): the primary is down or a "
                "failover is under way: try again once a primary is up (the engine does by itself)"
            )
        if isinstance(exc, asyncpg.InternalClientError):
            return StoreUnavailable(
                f"PostgreSQL store {self.where}: the connection broke ({_one_line(exc)}); "
                "it was dropped, the next try connects afresh"
            )
        if isinstance(exc, asyncpg.DataError):
            return UnstorableData(f"PostgreSQL store {self.where}: {_one_line(exc)}")
        if isinstance(exc, _UNAVAILABLE):
            return StoreUnavailable(f"PostgreSQL store {self.where}: {_one_line(exc)}")
        return StoreError(f"PostgreSQL store {self.where}: {_one_line(exc)}")

    async def open(self) -> None:
        if self._pool is not None:
            return
        self.sealer.keyring()  # a malformed key variable stops the store here, not a commit
        await self._connect()
        try:
            await self._check_schema()
        except BaseException:
            await self._disconnect()
            raise

    def _settings(self) -> dict[str, str]:
        settings = {"application_name": application_name()}
        if self.schema:
            settings["search_path"] = quote_ident(self.schema)
        return settings

    async def _connect(self) -> None:
        try:
            self._pool = await asyncpg.create_pool(
                self.url,
                min_size=self.min_size,
                max_size=self.max_size,
                reset=_keep_session,
                timeout=10,
                server_settings=self._settings(),
            )
        except _DRIVER_ERRORS as exc:
            raise self._translate(exc) from None
        except ValueError as exc:
            raise StoreError(
                f"invalid PostgreSQL URL for {self.where} ({exc}): expected "
                "postgresql://user[:password]@host[:port]/database"
            ) from None

    async def _disconnect(self) -> None:
        await self.stop_listening()
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def _check_schema(self) -> None:
        async with self._connection() as conn, conn.transaction():
            await self._lock(conn)
            current = await _version(conn)
            newest = latest_version(DIALECT)
            if current > newest:
                raise StoreError(
                    f"the PostgreSQL database {self.where} was written by a newer tideflow "
                    f"(schema {current}, this version knows up to {newest}); upgrade tideflow "
                    "to use it"
                )
            if current < newest:
                if current and not self.auto_upgrade:
                    raise StoreError(
                        f"the PostgreSQL database {self.where} is at schema {current}, this "
                        f"tideflow needs {newest}: run `tideflow db upgrade --store "
                        f"{redacted(self.url)}`"
                    )
                await _migrate(conn)

    async def _lock(self, conn: Any) -> None:
        """Serialise schema checks and migrations of processes starting together, and
        create the store's schema if it is missing (looked up first: CREATE SCHEMA needs
        a privilege on the database even when the schema exists)."""
        await conn.execute(Q["migration_lock"], self.schema or "")
        if self.schema and not await conn.fetchval(Q["schema_exists"], self.schema):
            await conn.execute(f"CREATE SCHEMA {quote_ident(self.schema)}")

    async def schema_version(self) -> int:
        async with self._connection() as conn:
            return await _version(conn)

    async def upgrade(self) -> list[int]:
        """Apply missing migrations (opening the store if needed); the versions applied."""
        if self._pool is None:
            await self._connect()
        async with self._connection() as conn, conn.transaction():
            await self._lock(conn)
            current, newest = await _version(conn), latest_version(DIALECT)
            if current > newest:
                raise StoreError(
                    f"the PostgreSQL database {self.where} was written by a newer tideflow "
                    f"(schema {current}, this version knows up to {newest})"
                )
            return await _migrate(conn)

    async def close(self) -> None:
        if self._pool is None:
            return
        try:
            if self.drop_schema_on_close and self.schema:
                async with self._connection() as conn:
                    await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(self.schema)} CASCADE")
        finally:
            await self._disconnect()

    # -- definitions ------------------------------------------------------------

    async def save_definition(self, plan: Plan) -> bool:
        self.sealer.learn(plan)
        key = (plan.name, plan.version)
        known = self._definitions.get(key)
        if known is None:
            async with self._connection() as conn:
                known = await conn.fetchval(Q["definition_hash"], *key)
                if known is None:
                    known = await self._insert_definition(conn, plan)
                    if known is None:
                        self._definitions[key] = plan.hash
                        # as SQLite's: read back at once, it is not compiled again
                        self._plans.setdefault(plan.hash, plan)
                        return True
            self._definitions[key] = known
        if known != plan.hash:
            raise sb.definition_conflict(plan.name, plan.version)
        return False

    async def _insert_definition(self, conn: Any, plan: Plan) -> str | None:
        """Insert the plan; None when inserted, else the hash registered meanwhile."""
        async with conn.transaction():
            await conn.execute(Q["insert_plan"], plan.hash, sb.dumps(dict(plan.source)))
            inserted = await conn.fetchval(
                Q["insert_definition"], plan.name, plan.version, plan.hash, time.time()
            )
            if inserted is not None:
                await conn.executemany(Q["insert_trigger"], sb.trigger_rows(plan))
                return None
            existing = await conn.fetchval(Q["definition_hash"], plan.name, plan.version)
            if existing != plan.hash:
                raise sb.definition_conflict(plan.name, plan.version)
            return str(existing)

    async def get_definition(self, name: str, version: str | None = None) -> Plan:
        async with self._connection() as conn:
            rows = await conn.fetch(Q["definition_versions"], name)
            plan_hash = sb.chosen_definition(name, version, rows)
            if plan_hash is None:
                known = [str(r[0]) for r in await conn.fetch(Q["definition_names"])]
                raise sb.no_definition(name, version, known)
        return await self._plan(plan_hash)

    async def set_definition_active(self, name: str, version: str, active: bool) -> bool:
        async with self._connection() as conn, conn.transaction():
            rows = await conn.fetch(Q["definition_versions"], name)
            was = next((bool(a) for v, _, a in rows if v == version), None)
            if was is None:
                known = [str(r[0]) for r in await conn.fetch(Q["definition_names"])]
                raise sb.no_definition(name, version, known)
            if was == active:
                return False
            await conn.execute(Q["set_definition_active"], active, name, version)
            return True

    async def triggered_by(self, event: str) -> list[DefinitionSummary]:
        async with self._connection() as conn:
            rows = await conn.fetch(Q["triggered_by"], event)
        return [sb.definition_summary(row) for row in rows]

    async def get_plan(self, plan_hash: str) -> Plan:
        return await self._plan(plan_hash)

    async def _plan(self, plan_hash: str) -> Plan:
        plan = self._plans.get(plan_hash)
        if plan is None:
            async with self._connection() as conn:
                row = await conn.fetchrow(Q["plan_source"], plan_hash)
            if row is None:
                raise NotFound(f"no plan with hash {plan_hash} in {self.where}")
            source, name, version = row
            plan = self._plans[plan_hash] = sb.plan_from_source(
                self.compile_plan, source, sb.plan_label(plan_hash, name, version), plan_hash
            )
            self.sealer.learn(plan)
        return plan

    async def list_definitions(self, name: str | None = None) -> list[DefinitionSummary]:
        async with self._connection() as conn:
            rows = await conn.fetch(Q["list_definitions"])
        return [sb.definition_summary(row) for row in rows if name is None or row[0] == name]

    # -- runs -------------------------------------------------------------------

    async def create_runs(self, runs: Sequence[NewRun]) -> list[Created | Exception]:
        plan_hashes = [state.plan_hash for state, _ in runs]
        if not all(map(self.sealer.knows, plan_hashes)):
            await sb.learn_plans(self.get_plan, self.sealer, plan_hashes)
        rows = sb.new_run_rows(runs, self.sealer)
        done: list[Created | Exception | None] = [
            row if isinstance(row, Exception) else None for row in rows
        ]
        # One statement for the batch. A run whose id or key an earlier run of the batch
        # has waits for the next round: which of two equal rows one INSERT keeps is not
        # said, and the first asked must be the one created.
        batch: list[int] = []
        later: list[int] = []
        ids: set[str] = set()
        keys: set[str] = set()
        for i, ((state, key), row) in enumerate(zip(runs, rows, strict=True)):
            if isinstance(row, Exception):
                continue
            if state.run_id in ids or (key is not None and key in keys):
                later.append(i)
                continue
            ids.add(state.run_id)
            if key is not None:
                keys.add(key)
            batch.append(i)
        if batch:
            columns = [list(column) for column in zip(*(rows[i] for i in batch), strict=True)]
            async with self._connection() as conn:
                inserted = {r[0] for r in await conn.fetch(Q["insert_runs"], *columns)}
                missed = [runs[i][1] for i in batch if runs[i][0].run_id not in inserted]
                owners: dict[str, str] = {}
                if any(key is not None for key in missed):
                    found = await conn.fetch(Q["runs_by_idempotency_keys"], missed)
                    owners = {str(key): str(run_id) for key, run_id in found}
            for i in batch:
                state, key = runs[i]
                if state.run_id in inserted:
                    done[i] = (state.run_id, True)
                elif key is not None and key in owners:
                    done[i] = (owners[key], False)
                else:
                    done[i] = RunExists(f"run {state.run_id} exists already")
        if later:
            again = await self.create_runs([runs[i] for i in later])
            for i, result in zip(later, again, strict=True):
                done[i] = result
        return [result for result in done if result is not None]

    async def load_run(self, run_id: str) -> StoredRun:
        async with self._connection() as conn:
            row = await conn.fetchrow(Q["load_run"], run_id)
        if row is None:
            raise sb.no_run(run_id)
        snapshot, last_seq, seqs, events = row
        state = sb.snapshot_from_row(run_id, snapshot, self.sealer)
        tail = [
            sb.event_from_row(run_id, s, data, self.sealer)
            for s, data in zip(seqs, events, strict=True)
        ]
        return StoredRun(snapshot=state, tail=tail, last_seq=int(last_seq))

    async def commit(self, batch: Sequence[AppliedEvent], relayed: Sequence[str] = ()) -> None:
        if not batch:
            if relayed:  # one statement: atomic without a transaction block
                async with self._connection() as conn:
                    await conn.execute(Q["delete_outbox"], list(relayed))
            return
        plans = {applied.state.plan_hash for applied in batch}
        if not self.sealer.knows_all(plans):
            await sb.learn_plans(self.get_plan, self.sealer, plans)
        rows = sb.batch_rows(batch, self.sealer.for_plans(plans))
        document = commit_document(rows, index_rows(batch), relayed)
        async with self._connection() as conn:
            try:
                await conn.execute(Q["commit_batch"], document)
            except asyncpg.PostgresError as exc:
                if exc.sqlstate == STALE_RUN:
                    raise ConcurrencyConflict(exc.message) from None
                raise

    async def history(self, run_id: str) -> list[HistoryEntry]:
        async with self._connection() as conn:
            rows = await conn.fetch(Q["history"], run_id)
            if not rows and await conn.fetchval(Q["run_exists"], run_id) is None:
                raise sb.no_run(run_id)
        return [sb.history_entry(run_id, row, self.sealer) for row in rows]

    async def get_run(self, run_id: str) -> RunSummary:
        async with self._connection() as conn:
            row = await conn.fetchrow(Q["get_run"], run_id)
        if row is None:
            raise sb.no_run(run_id)
        return sb.summary_from_row(row, self.sealer)

    async def list_runs(
        self, filter: RunFilter | None = None, *, limit: int = 100, cursor: str | None = None
    ) -> RunPage:
        sql, params = sb.list_runs_query(filter or RunFilter(), limit, cursor, lambda n: f"${n}")
        async with self._connection() as conn:
            rows = await conn.fetch(sql, *params)
        return sb.run_page(rows, limit, self.sealer)

    async def unfinished_runs(self) -> list[str]:
        async with self._connection() as conn:
            rows = await conn.fetch(Q["unfinished_runs"])
        return [str(row[0]) for row in rows]

    async def pending_runs(self, limit: int, after: PendingRun | None = None) -> list[PendingRun]:
        async with self._connection() as conn:
            rows = await conn.fetch(Q["pending_runs"], *sb.queue_after(after), limit)
        return [sb.pending_run(row) for row in rows]

    async def count_pending(self, ahead_of: str | None = None) -> int:
        async with self._connection() as conn:
            if ahead_of is None:
                return int(await conn.fetchval(Q["count_pending"]))
            return int(await conn.fetchval(Q["count_pending_ahead"], ahead_of))

    async def pending_outbox(self, limit: int = 1000) -> list[OutboxItem]:
        async with self._connection() as conn:
            rows = await conn.fetch(Q["pending_outbox"], limit)
        return [sb.outbox_item(row, self.sealer) for row in rows]

    async def unindexed_runs(self, limit: int = 1000) -> list[str]:
        async with self._connection() as conn:
            rows = await conn.fetch(Q["unindexed_runs"], limit)
        return [str(row[0]) for row in rows]

    async def index_run(self, state: RunState, in_flight: Sequence[TaskLease]) -> None:
        rows = state_rows(state, in_flight)
        async with self._connection() as conn, conn.transaction():
            await write_index(conn, IndexRows(ended=[state.run_id]))
            await write_index(conn, rows)
            await conn.execute(Q["indexed_run"], [state.run_id])

    async def due_timers(
        self, before: float, limit: int = 1000, *, after: float | None = None
    ) -> list[DueTimer]:
        low = -math.inf if after is None else after
        async with self._connection() as conn:
            rows = await conn.fetch(Q["due_timers"], low, before, limit)
        return [DueTimer(run_id=r, timer_id=t, fire_at=float(f)) for r, t, f in rows]

    # -- schedules ---------------------------------------------------------------

    async def list_schedules(self, workflow: str | None = None) -> list[ScheduleRow]:
        async with self._connection() as conn:
            rows = await conn.fetch(Q["list_schedules"], workflow)
        return [sb.schedule_from_row(tuple(row)) for row in rows]

    async def insert_schedule(self, row: ScheduleRow) -> bool:
        params = sb.schedule_insert_params(row, time.time())
        async with self._connection() as conn:
            return await conn.fetchval(Q["insert_schedule"], *params) is not None

    async def update_schedule(self, row: ScheduleRow) -> bool:
        params = sb.schedule_update_params(row, time.time())
        async with self._connection() as conn:
            return await conn.fetchval(Q["update_schedule"], *params) is not None

    async def remove_schedule(self, workflow: str, schedule_id: str) -> bool:
        async with self._connection() as conn:
            return await conn.fetchval(Q["remove_schedule"], workflow, schedule_id) is not None

    async def due_schedules(
        self, before: float, limit: int = 1000, *, after: float | None = None
    ) -> list[ScheduleRow]:
        low = -math.inf if after is None else after
        async with self._connection() as conn:
            rows = await conn.fetch(Q["due_schedules"], low, before, limit)
        return sb.due_schedule_rows(tuple(row) for row in rows)

    async def runs_waiting_for(self, signal: str) -> list[str]:
        async with self._connection() as conn:
            rows = await conn.fetch(Q["runs_waiting_for"], signal)
        return [str(row[0]) for row in rows]

    async def claim_task(
        self, run_id: str, step_key: str, attempt: int, *, owner: str, now: float, until: float
    ) -> bool:
        async with self._connection() as conn:
            row = await conn.fetchval(Q["claim_task"], owner, until, run_id, step_key, attempt, now)
        return row is not None

    async def extend_task(
        self, run_id: str, step_key: str, attempt: int, *, owner: str, until: float
    ) -> bool:
        async with self._connection() as conn:
            row = await conn.fetchval(Q["extend_task"], until, run_id, step_key, attempt, owner)
        return row is not None

    async def tasks_in_flight(
        self, after: tuple[str, str] | None = None, limit: int = 10_000
    ) -> list[TaskLease]:
        run_id, step_key = after or ("", "")
        async with self._connection() as conn:
            rows = await conn.fetch(Q["tasks_in_flight"], run_id, step_key, limit)
        return [sb.task_lease(tuple(row)) for row in rows]

    async def expired_tasks(self, before: float, limit: int = 10_000) -> list[TaskLease]:
        async with self._connection() as conn:
            rows = await conn.fetch(Q["expired_tasks"], before, limit)
        return [sb.task_lease(tuple(row)) for row in rows]

    # -- API tokens ------------------------------------------------------------------

    async def create_token(self, token: ApiToken) -> None:
        async with self._connection() as conn:
            inserted = await conn.fetchval(Q["insert_token"], *sb.token_row(token))
        if inserted is None:
            raise sb.token_taken(token.token_id)

    async def get_token(self, token_id: str) -> ApiToken | None:
        async with self._connection() as conn:
            row = await conn.fetchrow(Q["get_token"], token_id)
        return sb.token_from_row(None if row is None else tuple(row))

    async def list_tokens(self) -> list[ApiToken]:
        async with self._connection() as conn:
            rows = await conn.fetch(Q["list_tokens"])
        return sb.tokens_from_rows([tuple(row) for row in rows])

    async def record_token_use(self, token_id: str, at: float) -> None:
        async with self._connection() as conn:
            await conn.execute(Q["record_token_use"], at, token_id)

    async def revoke_token(self, token_id: str, at: float) -> bool:
        async with self._connection() as conn:
            return await conn.fetchval(Q["revoke_token"], at, token_id) is not None

    async def prune(
        self, older_than: float, *, batch_size: int = 500, archive: Archive | None = None
    ) -> int:
        total = 0
        while True:
            async with self._connection() as conn:
                ids = [r[0] for r in await conn.fetch(Q["prunable_runs"], older_than, batch_size)]
                if not ids:
                    return total
                if archive is not None:
                    await archive_runs(conn, ids, archive, self.sealer)
                async with conn.transaction():
                    await conn.execute(Q["delete_history"], ids)
                    await conn.execute(Q["delete_run_outbox"], ids)
                    await conn.execute(Q["delete_runs"], ids)
            total += len(ids)


async def _version(conn: Any) -> int:
    if not await conn.fetchval(Q["schema_version_table"]):
        return 0
    return int(await conn.fetchval(Q["schema_version"]) or 0)


async def _migrate(conn: Any) -> list[int]:
    """Apply every migration newer than the schema; the caller holds the migration lock."""
    await conn.execute(Q["create_schema_version"])
    current = await _version(conn)
    applied = []
    for migration in migrations(DIALECT):
        if migration.version > current:
            await conn.execute(migration.sql)
            await conn.execute(Q["insert_schema_version"], migration.version, time.time())
            applied.append(migration.version)
    return applied


def _describe(url: str) -> tuple[str, str, str]:
    """``host:port`` (``h1:p1,h2:p2`` for a multi-host URL, in its order), database and
    user of a PostgreSQL URL (defaults as libpq's)."""
    try:
        parts = urlsplit(url)
        servers = [_host_port(host) for host in parts.netloc.rpartition("@")[2].split(",")]
    except ValueError:
        return "<invalid URL>", "?", "?"
    user = unquote(parts.username) if parts.username else getpass.getuser()
    database = unquote(parts.path.lstrip("/")) or user
    return ",".join(servers), database, user


def _host_port(text: str) -> str:
    """One host of a URL's host list as ``host:port`` (an IPv6 address in brackets)."""
    host, port = text, ""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError(f"unclosed [ in host {text!r}")
        host, port = text[: end + 1], text[end + 1 :].removeprefix(":")
    elif ":" in text:
        host, _, port = text.rpartition(":")
    if port and not port.isdigit():
        raise ValueError(f"port {port!r} is not a number")
    return f"{unquote(host) or 'localhost'}:{port or 5432}"


def redacted(url: str) -> str:
    """The URL with its password masked, for messages."""
    parts = urlsplit(url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.partition(":")[0]
    return parts._replace(netloc=f"{user}:***@{hostport}").geturl()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


__all__ = ["PostgresStore", "application_name"]
