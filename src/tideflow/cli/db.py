"""`tideflow db …`: a store's schema (upgrade, status) and retention (prune)."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Annotated, Any, Protocol, runtime_checkable

import orjson
import typer

from tideflow.cli.common import (
    DEFAULT_STORE,
    EXIT_FAILED,
    EXIT_USAGE,
    JsonOption,
    StoreOption,
    build_store,
    display_url,
    err,
    fail_usage,
    iso,
    opened_store,
    out,
    run_async,
    sqlite_file,
    store_exists,
    store_unavailable,
    write_json,
)
from tideflow.errors import TideflowError

if TYPE_CHECKING:
    from collections.abc import Callable

    from tideflow.store import Store

db_app = typer.Typer(
    help="Manage a store: schema migrations (upgrade, status) and retention (prune).",
    no_args_is_help=True,
)


@runtime_checkable
class VersionedSchema(Protocol):
    """A store with versioned migrations (the SQL stores; memory:// has no schema)."""

    async def schema_version(self) -> int: ...

    async def upgrade(self) -> list[int]: ...

    async def close(self) -> None: ...


def code_schema_version() -> int:
    """The schema version this tideflow writes (one sequence for SQLite and PostgreSQL)."""
    from tideflow.store.sqlfiles import latest_version

    return latest_version("sqlite")


# -- db upgrade -----------------------------------------------------------------------


@db_app.command("upgrade")
def upgrade_cmd(store: StoreOption = DEFAULT_STORE) -> None:
    """Apply the schema migrations the store is missing (a missing SQLite file is created).

    `tideflow run` and `tideflow resume` upgrade on start; the other commands
    refuse an old schema and ask for this. A store written by a newer tideflow
    is refused (exit 2): upgrade tideflow instead.

    Examples:
      tideflow db upgrade
      tideflow db upgrade --store postgresql://tideflow@db.internal/tideflow
    """
    out.print(run_async(_upgrade(store)), markup=False)


async def _upgrade(url: str) -> str:
    where = display_url(url)
    if not store_exists(url):
        async with opened_store(url, create=True, upgrade=True) as store:
            return f"created {where} at schema version {await _version(store)}"
    store = build_store(url, create=False, upgrade=False)
    if not isinstance(store, VersionedSchema):
        return f"{where} has no schema: nothing to upgrade"
    applied, version = await _upgrade_unopened(url, store)
    if not applied:
        return f"{where} is already at schema version {version}"
    listed = ", ".join(str(v) for v in applied)
    return f"applied migration(s) {listed} to {where}: now at schema version {version}"


async def _upgrade_unopened(url: str, store: VersionedSchema) -> tuple[list[int], int]:
    """``upgrade()`` connects by itself and applies what is missing (both SQL stores)."""
    try:
        return await store.upgrade(), await store.schema_version()
    except Exception as exc:
        raise store_unavailable(url, exc) from None
    finally:
        await store.close()


async def _version(store: Store) -> int | None:
    return await store.schema_version() if isinstance(store, VersionedSchema) else None


# -- db status ------------------------------------------------------------------------


@db_app.command("status")
def status_cmd(as_json: JsonOption = False, store: StoreOption = DEFAULT_STORE) -> None:
    """Show the store's schema version next to the one this tideflow uses, and check
    that its data is sound.

    The check reads the whole store: SQLite's `PRAGMA integrity_check` (damage
    anywhere in the file, also where it still opens), then on SQLite and
    PostgreSQL that every table exists and the recorded migrations are this
    tideflow's. Nothing is changed.

    Exit 0 when the versions match and the check passes, 1 when the store does
    not exist yet, 2 when it cannot be used as it is (an old schema: run
    `tideflow db upgrade`; a newer one: upgrade tideflow; damaged: restore a
    backup; unreachable). `pending_effects` counts the effects of committed
    changes that no engine has carried out yet (a stopped engine leaves them; the
    next one relays them on start). On a cluster's store it lists the live servers
    and the event partitions each holds (and those no live server holds). --json
    prints {"store", "schema_version", "code_schema_version", "up_to_date",
    "problems": [...], "pending_effects", "cluster": null or {"partitions",
    "servers": [{"owner", "host", "pid", "partitions"}], "unheld"}}.

    Examples:
      tideflow db status
      tideflow db status --store sqlite:///orders.db --json
    """
    version, problems, pending, cluster = run_async(_status(store))
    code = code_schema_version()
    up_to_date = version == code
    if as_json:
        write_json(
            {
                "store": display_url(store),
                "schema_version": version,
                "code_schema_version": code,
                "up_to_date": up_to_date,
                "problems": problems,
                "pending_effects": pending,
                "cluster": cluster,
            }
        )
    elif version is None:
        out.print(f"{display_url(store)}: no schema (nothing is stored between processes)")
    elif not problems:
        state = "up to date" if up_to_date else "run `tideflow db upgrade`"
        out.print(
            f"{display_url(store)}: schema version {version}, this tideflow: {code} ({state}); "
            "integrity check passed",
            markup=False,
        )
        if pending:
            out.print(f"{pending} effect(s) wait to be relayed by the next engine", markup=False)
        if cluster is not None:
            _print_cluster(cluster)
    if problems:
        _report_damage(store, problems)
        raise typer.Exit(EXIT_USAGE)
    if version is not None and not up_to_date:
        raise typer.Exit(EXIT_FAILED)


def _report_damage(url: str, problems: list[str]) -> None:
    err.print(
        f"error: {display_url(url)} is damaged ({len(problems)} problem(s) found): restore it "
        "from a backup (docs/operations.md, Backup), or point --store at another store",
        markup=False,
    )
    for problem in problems:
        err.print(f"  {problem}", markup=False)


def _print_cluster(cluster: dict[str, Any]) -> None:
    from tideflow.runtime.partitions import shown

    servers = cluster["servers"]
    out.print(
        f"cluster: {cluster['partitions']} event partitions, {len(servers)} live server(s)",
        markup=False,
    )
    for server in servers:
        out.print(
            f"  server pid {server['pid']} on {server['host']} ({server['owner']}): "
            f"partitions {shown(server['partitions'])}",
            markup=False,
        )
    if cluster["unheld"]:
        out.print(f"  held by no live server: {shown(cluster['unheld'])}", markup=False)


async def _cluster(store: Store) -> dict[str, Any] | None:
    """The cluster's servers and who holds which partition; None on an embedded store."""
    from tideflow.runtime.partitions import MEMBER, PARTITION, PARTITION_COUNT

    try:
        count = await store.lease_holder(PARTITION_COUNT)
        if count is None:
            return None
        now = time.time()
        members = [m for m in await store.list_leases(MEMBER) if m.expires_at > now]
        held = [p for p in await store.list_leases(PARTITION) if p.expires_at > now]
    except Exception:  # an old schema: `db upgrade` comes first, status says so
        return None
    by_owner: dict[str, list[int]] = {m.owner: [] for m in members}
    for lease in held:
        by_owner.setdefault(lease.owner, []).append(int(lease.name[len(PARTITION) :]))
    live = {p for m in members for p in by_owner[m.owner]}
    return {
        "partitions": int(count.owner),
        "servers": [
            {
                "owner": m.owner,
                "host": m.host,
                "pid": m.pid,
                "partitions": sorted(by_owner[m.owner]),
            }
            for m in members
        ],
        "unheld": [p for p in range(int(count.owner)) if p not in live],
    }


async def _status(url: str) -> tuple[int | None, list[str], int, dict[str, Any] | None]:
    if not store_exists(url):
        return 0, [], 0, None
    async with opened_store(url, upgrade=False) as store:
        version = await _version(store)
        path = sqlite_file(store)
        try:
            from tideflow.cli.integrity import store_problems

            problems = await store_problems(store, None if path is None else str(path))
        except TideflowError:
            raise
        except Exception as exc:
            raise store_unavailable(url, exc) from None
        pending = 0 if problems or version is None else await _pending_effects(store)
        cluster = None if problems or version is None else await _cluster(store)
        return version, problems, pending, cluster


async def _pending_effects(store: Store) -> int:
    try:
        return len(await store.pending_outbox(limit=PENDING_SHOWN))
    except Exception:  # an old schema: `db upgrade` comes first, status says so
        return 0


PENDING_SHOWN = 100_000
"""Counted up to this many (a store holding more has a bigger problem than the count)."""


# -- db prune -------------------------------------------------------------------------


class _ArchiveFile:
    """Appends each pruned run as one JSON line; flushed per run, fsynced at the end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._file = path.open("ab")
        except OSError as exc:
            raise fail_usage(f"cannot write archive {path}: {exc.strerror or exc}") from None

    def __call__(self, record: dict[str, Any]) -> None:
        self._file.write(orjson.dumps(record, default=str) + b"\n")
        self._file.flush()

    def __enter__(self) -> _ArchiveFile:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with contextlib.suppress(OSError):
            self._file.flush()
            os.fsync(self._file.fileno())
        self._file.close()


@db_app.command("prune")
def prune_cmd(
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than",
            metavar="DURATION",
            help="Remove runs that ended longer ago than this (30d, 12h, PT1H; 0s: every ended run).",
            show_default=False,
        ),
    ],
    archive: Annotated[
        Path | None,
        typer.Option(
            "--archive",
            metavar="FILE.jsonl",
            help='Append each removed run to FILE as one JSON line {"run": ..., "history": [...]}.',
        ),
    ] = None,
    no_archive: Annotated[
        bool, typer.Option("--no-archive", help="Drop the runs without keeping them anywhere.")
    ] = False,
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, help="Runs removed per transaction.")
    ] = 500,
    events_older_than: Annotated[
        str,
        typer.Option(
            "--events-older-than",
            metavar="DURATION",
            help="Forget the gateway's records of events (the unmatched ones too) whose "
            "buffer ended longer ago than this.",
        ),
    ] = "7d",
    as_json: JsonOption = False,
    store: StoreOption = DEFAULT_STORE,
) -> None:
    """Remove ended runs (and their history) older than --older-than, in batches.

    Exactly one of --archive FILE and --no-archive is required. Unfinished runs
    are never removed; each batch is its own short transaction, so live work
    goes on meanwhile. The event gateway's records (the unmatched events, and what
    answers a redelivery `duplicate`) go after --events-older-than (7d). --json
    prints {"pruned", "ended_before", "archive", "events_pruned", "events_before"}.

    Examples:
      tideflow db prune --older-than 30d --archive runs-2025-01.jsonl
      tideflow db prune --older-than 90d --no-archive --batch-size 200
    """
    if (archive is None) == (not no_archive):
        raise fail_usage("pass exactly one of --archive FILE.jsonl and --no-archive")
    from tideflow.dsl import parse_duration

    now = time.time()
    cutoff = now - _duration(parse_duration, older_than, "--older-than")
    events_cut = now - _duration(parse_duration, events_older_than, "--events-older-than")
    pruned, forgot = run_async(_prune(store, cutoff, batch_size, archive, events_cut))
    if as_json:
        write_json(
            {
                "pruned": pruned,
                "ended_before": iso(cutoff),
                "archive": archive and str(archive),
                "events_pruned": forgot,
                "events_before": iso(events_cut),
            }
        )
        return
    where = f"; archived to {archive}" if archive is not None else ""
    out.print(f"pruned {pruned} run(s) that ended before {iso(cutoff)}{where}", markup=False)
    out.print(f"forgot {forgot} event record(s) kept since before {iso(events_cut)}", markup=False)


def _duration(parse: Callable[[str], float], text: str, option: str) -> float:
    try:
        seconds = parse(text)
    except ValueError as exc:
        raise fail_usage(f"{option}: {exc}") from None
    if seconds < 0:
        raise fail_usage(f"{option} {text!r} must not be negative")
    return seconds


async def _prune(
    url: str, cutoff: float, batch_size: int, archive: Path | None, events_cut: float
) -> tuple[int, int]:
    async with opened_store(url) as store:
        if archive is None:
            pruned = await store.prune(cutoff, batch_size=batch_size)
        else:
            with _ArchiveFile(archive) as sink:
                try:
                    pruned = await store.prune(cutoff, batch_size=batch_size, archive=sink)
                except OSError as exc:
                    # The batch being archived was not deleted: nothing is lost.
                    raise fail_usage(
                        f"cannot write archive {archive}: {exc.strerror or exc}"
                    ) from None
        return pruned, await store.prune_events(events_cut)


__all__ = ["db_app"]
