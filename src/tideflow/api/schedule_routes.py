"""The REST routes of schedules (docs/schedules.md, docs/api.md): list and read them
(viewer), pause, resume and trigger them (operator: action ``schedules``), create and
delete them (admin: action ``definitions``, since that changes what the deployment
runs)."""

from __future__ import annotations

from typing import Annotated

from fastapi import FastAPI, Query

from tideflow.api.auth_http import allow
from tideflow.api.models import (
    CreateSchedule,
    ScheduleChange,
    ScheduleDeleted,
    ScheduleList,
    ScheduleTriggered,
    ScheduleView,
)
from tideflow.client import Client
from tideflow.model.tokens import Action
from tideflow.runtime.schedules import schedule_data

__all__ = ["schedule_routes"]

READ, STEER, DELETE = allow(Action.READ), allow(Action.SCHEDULES), allow(Action.DEFINITIONS)
"""Reads; pause, resume, trigger; create and delete (which change what the deployment
runs, like registering a definition)."""


def schedule_routes(app: FastAPI, client: Client) -> None:
    @app.get("/schedules", tags=["schedules"], dependencies=[READ])
    async def list_schedules(
        workflow: Annotated[str | None, Query(min_length=1)] = None,
    ) -> ScheduleList:
        """The schedules (of one workflow, when given) with their next fire times."""
        rows = await client.schedules(workflow)
        return ScheduleList(schedules=[ScheduleView(**schedule_data(r)) for r in rows])

    @app.post("/schedules", status_code=201, tags=["schedules"], dependencies=[DELETE])
    async def create_schedule(body: CreateSchedule) -> ScheduleView:
        """Add a schedule to a registered workflow (it starts the highest active version;
        registering versions leaves it alone); 409 when the id is taken, 422 for a bad
        schedule."""
        row = await client.create_schedule(body.workflow, body.schedule)
        return ScheduleView(**schedule_data(row))

    @app.get("/schedules/{workflow}/{schedule_id}", tags=["schedules"], dependencies=[READ])
    async def get_schedule(workflow: str, schedule_id: str) -> ScheduleView:
        """One schedule."""
        return ScheduleView(**schedule_data(await client.schedule(workflow, schedule_id)))

    @app.post("/schedules/{workflow}/{schedule_id}/pause", tags=["schedules"], dependencies=[STEER])
    async def pause_schedule(workflow: str, schedule_id: str) -> ScheduleChange:
        """Pause a schedule: it starts no run until resumed."""
        changed = await client.pause_schedule(workflow, schedule_id)
        return ScheduleChange(workflow=workflow, id=schedule_id, paused=True, changed=changed)

    @app.post(
        "/schedules/{workflow}/{schedule_id}/resume", tags=["schedules"], dependencies=[STEER]
    )
    async def resume_schedule(workflow: str, schedule_id: str) -> ScheduleChange:
        """Resume a schedule from its next slot (paused slots start nothing)."""
        changed = await client.resume_schedule(workflow, schedule_id)
        return ScheduleChange(workflow=workflow, id=schedule_id, paused=False, changed=changed)

    @app.post(
        "/schedules/{workflow}/{schedule_id}/trigger", tags=["schedules"], dependencies=[STEER]
    )
    async def trigger_schedule(workflow: str, schedule_id: str) -> ScheduleTriggered:
        """Start the schedule's run now (``inputs.scheduled_at``: now), whatever its
        overlap, paused or not."""
        run_id = await client.trigger_schedule(workflow, schedule_id)
        return ScheduleTriggered(workflow=workflow, id=schedule_id, run_id=run_id)

    @app.delete("/schedules/{workflow}/{schedule_id}", tags=["schedules"], dependencies=[DELETE])
    async def delete_schedule(workflow: str, schedule_id: str) -> ScheduleDeleted:
        """Delete a schedule (the same definition version registered again does not bring
        it back; a new version does)."""
        await client.delete_schedule(workflow, schedule_id)
        return ScheduleDeleted(workflow=workflow, id=schedule_id)
