"""Schedules: runs that start by themselves, at the slots of a definition's ``schedule:``.

Each live schedule is one store row (model/schedules.py ``ScheduleRow``, schema 7), keyed
by (workflow, schedule id). The rows follow the definitions: registering a version, or
activating or deactivating one, makes the rows of that workflow those of its highest
active version's ``schedule:`` (``sync_workflow``: new ids are added, changed ones take
the new spec, ids the version no longer has are removed; a schedule that was paused stays
paused). The row's ``fire_at`` (its next slot plus jitter) is a durable timer: every
runtime that fires schedules (``Runtime(schedules=True)``, `tideflow server`) arms one
wake-up for the soonest row and, when it falls due, starts the slot's run and advances
the row (runtime/schedule_timers.py).

Exactly one run per slot, however many servers fire it: the run's idempotency key is
``schedule:{workflow}:{schedule id}:{slot, ISO 8601 UTC}``, so a second start of the same
slot returns the run the first one made, and the row advances by a revision-checked
update (one writer wins, the other reads the row again). The slot is in the run's input as
``inputs.scheduled_at`` (ISO 8601 UTC), beside the schedule's ``input``.

What the client does to a schedule (``pause``, ``resume``, ``trigger``, ``delete``) is a
row update here too; docs/schedules.md describes the whole feature.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from tideflow.core.schedule_slots import fire_time, iso_slot, slot_after
from tideflow.errors import DefinitionConflict, DefinitionInactive, NotFound
from tideflow.model.schedules import ScheduleOrigin, ScheduleRow, ScheduleSpec
from tideflow.model.states import RUN_TERMINAL
from tideflow.store.base import Store

if TYPE_CHECKING:
    from tideflow.client import Client
    from tideflow.model.plan import Plan

log = logging.getLogger("tideflow.schedules")

__all__ = [
    "UPDATE_ATTEMPTS",
    "create",
    "delete",
    "find",
    "fresh_row",
    "idempotency_key",
    "run_input",
    "schedule_data",
    "set_paused",
    "start_slot",
    "sync_workflow",
    "trigger",
    "unfinished",
    "updated",
]

UPDATE_ATTEMPTS = 5
"""Reads and revision-checked writes of one row before giving up (another writer kept
changing it)."""


def schedule_data(row: ScheduleRow) -> dict[str, Any]:
    """A schedule as the CLI's --json and the HTTP API show it (times ISO 8601 UTC)."""

    def at(moment: float | None) -> str | None:
        return None if moment is None else iso_slot(moment)

    return {
        "workflow": row.workflow,
        "id": row.schedule_id,
        "version": row.version,
        "origin": str(row.origin),
        "spec": row.spec.to_data(),
        "paused": row.paused,
        "next_slot": at(row.next_slot),
        "next_fire_at": None if row.paused else at(row.fire_at),
        "last_slot": at(row.last_slot),
        "last_run_id": row.last_run_id,
        "buffered_slot": at(row.buffered_slot),
    }


def idempotency_key(workflow: str, schedule_id: str, slot: float) -> str:
    """One run per (schedule, slot), whichever server starts it."""
    return f"schedule:{workflow}:{schedule_id}:{iso_slot(slot)}"


def run_input(spec: ScheduleSpec, slot: float) -> dict[str, object]:
    """The schedule's ``input`` with ``scheduled_at``: the slot, ISO 8601 UTC."""
    return {**spec.input, "scheduled_at": iso_slot(slot)}


def fresh_row(
    workflow: str, version: str | None, spec: ScheduleSpec, now: float, origin: ScheduleOrigin
) -> ScheduleRow:
    """A new schedule's row: its first slot is the first one after ``now``."""
    return _moved(
        ScheduleRow(
            workflow=workflow,
            schedule_id=spec.id,
            version=version,
            origin=origin,
            spec=spec,
        ),
        slot_after(spec, now),
    )


def _moved(row: ScheduleRow, next_slot: float | None) -> ScheduleRow:
    fire_at = None if next_slot is None else fire_time(row.spec, row.workflow, next_slot)
    return dataclasses.replace(row, next_slot=next_slot, fire_at=fire_at)


async def find(
    store: Store, workflow: str, schedule_id: str, *, deleted: bool = False
) -> ScheduleRow:
    """The row of a schedule that is not deleted (or, with ``deleted``, that may be);
    ``NotFound`` names the known ones."""
    rows = [r for r in await store.list_schedules(workflow) if deleted or not r.deleted]
    for row in rows:
        if row.schedule_id == schedule_id:
            return row
    known = ", ".join(r.schedule_id for r in rows) or "none"
    raise NotFound(
        f"no schedule {schedule_id!r} of workflow {workflow!r} (its schedules: {known}); "
        "`tideflow schedules list` shows them all"
    )


async def updated(
    store: Store,
    workflow: str,
    schedule_id: str,
    change: Callable[[ScheduleRow], Awaitable[ScheduleRow | None]],
    *,
    deleted: bool = False,
) -> ScheduleRow | None:
    """Apply ``change`` to the schedule's row until its revision-checked write wins; the
    row written (None when ``change`` said to leave it). ``NotFound`` when there is no
    such (undeleted) row."""
    for _ in range(UPDATE_ATTEMPTS):
        row = await find(store, workflow, schedule_id, deleted=deleted)
        new = await change(row)
        if new is None:
            return None
        if await store.update_schedule(new):
            return dataclasses.replace(new, revision=new.revision + 1)
    raise RuntimeError(
        f"schedule {workflow}/{schedule_id} changed {UPDATE_ATTEMPTS} times while it was "
        "being updated: try again"
    )


# -- what the client does --------------------------------------------------------


async def sync_workflow(store: Store, workflow: str, now: float) -> None:
    """Make the definition rows of ``workflow`` those of its highest active version (see
    the module)."""
    plan = await _live_plan(store, workflow)
    wanted = {} if plan is None else {s.id: s for s in plan.schedules}
    version = None if plan is None else plan.version
    rows = {
        r.schedule_id: r
        for r in await store.list_schedules(workflow)
        if r.origin is ScheduleOrigin.DEFINITION
    }
    for schedule_id in rows.keys() - wanted.keys():
        await store.remove_schedule(workflow, schedule_id)
        log.info(
            "schedule %s/%s removed: the live version has no such schedule", workflow, schedule_id
        )
    for schedule_id, spec in wanted.items():
        row = rows.get(schedule_id)
        if row is None:
            fresh = fresh_row(workflow, version, spec, now, ScheduleOrigin.DEFINITION)
            if await store.insert_schedule(fresh):
                log.info("schedule %s/%s (%s) added", workflow, schedule_id, spec.every_text)
            elif any(r.schedule_id == schedule_id and r.origin is ScheduleOrigin.CLIENT
                     for r in await store.list_schedules(workflow)):  # fmt: skip
                log.warning(
                    "schedule %s/%s of version %s is not live: a schedule made through the "
                    "client has that id (delete it to let the definition's take its place)",
                    workflow, schedule_id, version,
                )  # fmt: skip
            continue
        if row.version != version or row.spec != spec:
            await _follow(store, row, version, spec, now)


async def _follow(
    store: Store, row: ScheduleRow, version: str | None, spec: ScheduleSpec, now: float
) -> None:
    async def change(current: ScheduleRow) -> ScheduleRow | None:
        if current.version == version and current.spec == spec:
            return None
        new = dataclasses.replace(
            current,
            version=version,
            spec=spec,
            deleted=current.deleted and current.version == version,
        )
        return _moved(new, slot_after(spec, now)) if current.spec != spec else new

    with contextlib.suppress(NotFound):  # removed meanwhile by another sync
        await updated(store, row.workflow, row.schedule_id, change, deleted=True)


async def _live_plan(store: Store, workflow: str) -> Plan | None:
    try:
        return await store.get_definition(workflow)
    except (DefinitionInactive, NotFound):
        return None


async def create(client: Client, workflow: str, raw: Any, now: float) -> ScheduleRow:
    """Add a schedule to a registered workflow through the client (origin ``client``): it
    starts the workflow's highest active version, and registrations leave it alone.
    ``DefinitionError`` for a bad schedule, ``NotFound`` for an unknown workflow,
    ``InputValidationError`` for an input the workflow's schema refuses,
    ``DefinitionConflict`` when the workflow has a schedule with that id."""
    from tideflow.dsl.schedules import parse_schedule

    spec = parse_schedule(raw)
    plan = await client.store.get_definition(workflow)
    client.check_input(plan, run_input(spec, now))
    row = fresh_row(workflow, None, spec, now, ScheduleOrigin.CLIENT)
    if await client.store.insert_schedule(row):
        log.info("schedule %s/%s (%s) created", workflow, spec.id, spec.every_text)
        return row
    existing = await find(client.store, workflow, spec.id, deleted=True)
    if existing.deleted:  # a definition's, deleted: the client's takes its place
        await client.store.remove_schedule(workflow, spec.id)
        return await create(client, workflow, raw, now)
    raise DefinitionConflict(
        f"workflow {workflow!r} has a schedule {spec.id!r} already (from its "
        f"{existing.origin}): give the new one another id, or delete that one first"
    )


async def set_paused(
    store: Store, workflow: str, schedule_id: str, paused: bool, now: float
) -> bool:
    """Pause or resume a schedule: whether that changed anything. A resumed schedule goes
    on from the first slot after ``now``: the slots that passed while it was paused are
    not caught up."""

    async def change(row: ScheduleRow) -> ScheduleRow | None:
        if row.paused == paused:
            return None
        new = dataclasses.replace(row, paused=paused)
        return new if paused else _moved(new, slot_after(row.spec, now))

    return await updated(store, workflow, schedule_id, change) is not None


async def delete(store: Store, workflow: str, schedule_id: str) -> None:
    """Delete a schedule. A definition's schedule keeps a deleted row, so that the same
    version registered again does not bring it back (a new version does)."""
    row = await find(store, workflow, schedule_id)
    if row.origin is ScheduleOrigin.CLIENT:
        await store.remove_schedule(workflow, schedule_id)
        return

    async def change(current: ScheduleRow) -> ScheduleRow:
        return dataclasses.replace(current, deleted=True, buffered_slot=None)

    await updated(store, workflow, schedule_id, change)


async def trigger(client: Client, workflow: str, schedule_id: str, now: float) -> str:
    """Start the schedule's run now, whatever its overlap and even when paused, with
    ``scheduled_at`` now: the run id. Its next slot is unchanged. What refuses the start
    (the input, a deactivated version) is raised."""
    row = await find(client.store, workflow, schedule_id)
    plan = await client.store.get_definition(row.workflow, row.version)
    key = f"{idempotency_key(workflow, schedule_id, now)}:now"
    run_id, _ = await client.launch(plan, run_input(row.spec, now), idempotency_key=key)

    async def change(current: ScheduleRow) -> ScheduleRow:
        return dataclasses.replace(current, last_run_id=run_id)

    await updated(client.store, workflow, schedule_id, change)
    return run_id


# -- starting a slot's run ---------------------------------------------------------


async def start_slot(
    client: Client, row: ScheduleRow, slot: float, *, key: str | None = None
) -> str | None:
    """Start (or find, by its idempotency key) the run of ``slot``: its id; None, logged,
    when the definition or the input refuses it (the slot is then over: it starts
    nothing, like a run that failed at once)."""
    from tideflow.errors import DefinitionError, InputValidationError

    try:
        plan = await client.store.get_definition(row.workflow, row.version)
        run_id, created = await client.launch(
            plan,
            run_input(row.spec, slot),
            idempotency_key=key or idempotency_key(row.workflow, row.schedule_id, slot),
        )
    except (InputValidationError, DefinitionInactive, DefinitionError, NotFound) as exc:
        log.warning(
            "schedule %s/%s: the run of slot %s cannot start: %s",
            row.workflow, row.schedule_id, iso_slot(slot), exc.message,
        )  # fmt: skip
        return None
    if created:
        log.info(
            "schedule %s/%s: started run %s for slot %s",
            row.workflow, row.schedule_id, run_id, iso_slot(slot),
        )  # fmt: skip
    return run_id


async def unfinished(store: Store, run_id: str | None) -> bool:
    """Whether the run is stored and has not ended (a pruned run has ended)."""
    if run_id is None:
        return False
    try:
        return (await store.get_run(run_id)).status not in RUN_TERMINAL
    except NotFound:
        return False
