"""Runs started by an event: definitions that declare ``triggers: [{event, match, input}]``.

An event (a CloudEvent as a dict: ``type``, ``source``, ``id``, ``data``, …) starts one run
of each workflow that has an active version with a trigger on the event's ``type`` whose
``match`` holds: of the highest such version, with the trigger's ``input`` (the event's
``data`` by default) as the run input. The run's idempotency key is made of the workflow
and the event's key (the gateway's: a digest of its ``source`` and ``id``), so the same
event delivered twice starts each run once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tideflow.errors import ExpressionEvaluationError, TideflowError
from tideflow.model.plan import Plan, TriggerSpec
from tideflow.model.versions import version_key

if TYPE_CHECKING:
    from tideflow.client import Client

log = logging.getLogger("tideflow.triggers")

__all__ = ["Triggered", "start_triggered", "trigger_of"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Triggered:
    """What an event did to one workflow with a trigger on its type."""

    workflow: str
    version: str
    run_id: str | None
    """The run it started (or had started: ``created`` False); None when it could not."""
    created: bool = False
    error: str | None = None
    """Why no run started (an input its schema refuses, say)."""


def trigger_of(plan: Plan, event: Mapping[str, Any]) -> TriggerSpec | None:
    """The plan's first trigger on the event's type whose ``match`` holds; a match that
    cannot be evaluated on this event (a missing field) does not hold."""
    scope = {"event": event}
    for trigger in plan.triggers:
        if trigger.event != event.get("type"):
            continue
        if trigger.match is None:
            return trigger
        try:
            if trigger.match.evaluate(scope):
                return trigger
        except ExpressionEvaluationError:
            continue
    return None


async def start_triggered(client: Client, event: Mapping[str, Any], key: str) -> list[Triggered]:
    """Start the runs ``event`` triggers (see the module); ``key`` identifies the event."""
    event_type = event.get("type")
    if not isinstance(event_type, str):
        return []
    newest: dict[str, str] = {}
    for summary in await client.store.triggered_by(event_type):
        known = newest.get(summary.name)
        if known is None or version_key(summary.version) > version_key(known):
            newest[summary.name] = summary.version
    started = []
    for workflow, version in sorted(newest.items()):
        plan = await client.definition(workflow, version)
        trigger = trigger_of(plan, event)
        if trigger is not None:
            started.append(await _start(client, plan, trigger, event, key))
    return started


async def _start(
    client: Client, plan: Plan, trigger: TriggerSpec, event: Mapping[str, Any], key: str
) -> Triggered:
    try:
        input = (
            event.get("data") if trigger.input is None else trigger.input.render({"event": event})
        )
        run_id, created = await client.launch(
            plan, input, idempotency_key=f"trigger:{plan.name}:{key}"
        )
    except TideflowError as exc:
        log.warning(
            "event %s (%s) does not start %s %s: %s",
            event.get("id"), event.get("type"), plan.name, plan.version, exc.message,
        )  # fmt: skip
        return Triggered(workflow=plan.name, version=plan.version, run_id=None, error=exc.message)
    return Triggered(workflow=plan.name, version=plan.version, run_id=run_id, created=created)
