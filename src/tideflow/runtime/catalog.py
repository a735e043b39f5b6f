"""Registering definitions and storing new runs: what a client's `start` and an engine's
child run have in common.

A new run is stored ``pending``; whoever created it then hands its ``RunStarted`` to
the engine (``started_event``), so a run is never started before it is durable. Starts
made concurrently (a burst of ``POST /runs``, of schedule slots, of child runs) are
stored together, one ``Store.create_runs`` transaction for what gathered while the
previous one was being committed (runtime/gathering.py): no timer, so a lone start costs
what it did.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from tideflow.dsl.regexes import stored_definitions
from tideflow.errors import InputValidationError, NotFound, StepError
from tideflow.model import storable
from tideflow.model.events import RunStarted
from tideflow.model.plan import Plan, Priority
from tideflow.model.run import RunState, new_run_state
from tideflow.runtime.clock import Clock
from tideflow.runtime.definitions import DefinitionSource, coerce_plan, is_plain_name
from tideflow.runtime.gathering import Gathering
from tideflow.runtime.poison import Failure, classify
from tideflow.runtime.runs import Plans
from tideflow.store.base import Created, NewRun, Store
from tideflow.store.sqlbase import inactive_version
from tideflow.worker.executors.registry import ExecutorRegistry

INLINE_INPUT_CHECK = 64 * 1024
"""Bytes (as JSON) of a run input checked against its schema on the caller's loop; a
larger one is checked in a thread (`Catalog.admit_input`)."""


def _json_size(value: Any) -> int:
    try:
        return len(orjson.dumps(value))
    except TypeError:  # not storable: check_input says so, at once
        return 0


class Catalog:
    def __init__(
        self,
        store: Store,
        executors: ExecutorRegistry,
        *,
        clock: Clock,
        definitions_dir: str | Path | None = None,
        max_run_input: int = storable.MAX_RUN_INPUT,
    ) -> None:
        self._store = store
        self._executors = executors
        self._clock = clock
        self._definitions = DefinitionSource(definitions_dir, executors)
        self._max_run_input = max_run_input
        self.plans = Plans(store)
        self.creating: Gathering[NewRun, Created] = Gathering(
            store.create_runs, apart=lambda exc: classify(exc) is not Failure.UNAVAILABLE
        )
        """New runs stored together (``create``)."""

    def compile_stored(self, source: Any) -> Plan:
        """A plan from its stored source (registered once, by whatever rules held then:
        an input pattern RE2 refuses does not keep its runs from loading)."""
        with stored_definitions():
            return coerce_plan(dict(source), self._executors)

    def action_types(self) -> Mapping[str, Mapping[str, Any]]:
        """The config schema of each step type the executors check (the others take any
        config): what a definition's action steps are checked against when it compiles."""
        return self._executors.schemas()

    def compile(self, definition: Any) -> Plan:
        """Compile a definition without registering it; ``DefinitionError`` lists every
        problem."""
        return coerce_plan(definition, self._executors)

    async def register(self, definition: Any) -> Plan:
        """Register a definition (Plan, Workflow builder, mapping, YAML text or file path)."""
        plan = self.compile(definition)
        await self._store.save_definition(plan)
        self.plans.add(plan)
        return plan

    async def resolve(self, workflow: Any, version: str | None) -> Plan:
        """A workflow by name (``registered``), or any definition ``register`` accepts
        (a Plan, a mapping, YAML text, a file path: what the Python API and the CLI hand
        over for the person at the keyboard), registered first."""
        if isinstance(workflow, str) and not self._definitions.looks_like_path(workflow):
            return await self.registered(workflow, version)
        return await self.register(workflow)

    async def registered(self, name: str, version: str | None) -> Plan:
        """A workflow by its name only, whatever the name looks like: never a file or a
        module the caller names (what a request or a definition names goes through here).
        A registered definition; else, for a plain name (``is_plain_name``), the highest
        version of that name among the definition files of the definitions directory,
        registered then. ``NotFound`` names nothing but ``name`` and ``version``."""
        try:
            plan = await self._store.get_definition(name, version)
        except NotFound:
            found = None
            if is_plain_name(name) and self._definitions.directory is not None:
                # its first look compiles every file there: not on the event loop
                found = await asyncio.to_thread(self._definitions.find, name, version)
            if found is None:
                raise unknown_workflow(name, version) from None
            return await self.register(found)
        if version is not None and not await self._active(name, version):
            raise inactive_version(name, version)
        return plan

    async def _active(self, name: str, version: str) -> bool:
        summaries = await self._store.list_definitions(name)
        return any(s.version == version and s.active for s in summaries)

    async def admit_input(self, plan: Plan, input: Any) -> None:
        """`check_input`, in a thread when the input is large and the plan has a schema:
        checking a megabyte against a JSON Schema takes seconds of Python, which must not
        hold the event loop (the thread gives it the GIL back every few milliseconds).
        The patterns of the schema run on RE2 (dsl/regexes.py), so the time is linear in
        the input, which the request body limit bounds."""
        if plan.input_schema is not None and _json_size(input) > INLINE_INPUT_CHECK:
            await asyncio.to_thread(self.check_input, plan, input)
        else:
            self.check_input(plan, input)

    def check_input(self, plan: Plan, input: Any) -> None:
        """Refuse an input that does not fit the plan or cannot be stored (no run is made)."""
        from tideflow.dsl.inputs import validate_input

        validate_input(plan, input)
        try:
            storable.check(input, "the run input", self._max_run_input)
        except StepError as exc:
            found = storable.integer_problem(input)  # named as a field: body.input.order.n
            fields = [] if found is None else [(storable.format_path(found[0], "$"), found[1])]
            raise InputValidationError(exc.message, fields=fields) from None

    async def create(
        self,
        plan: Plan,
        run_id: str,
        idempotency_key: str | None,
        input: Any,
        parent: str | None = None,
        parent_step: str | None = None,
        trace: str | None = None,
        priority: Priority = Priority.NORMAL,
    ) -> tuple[str, RunState | None]:
        """Store a new pending run: ``(run_id, state)``; for an idempotency key already
        used nothing is written: ``(the existing run's id, None)``. ``trace``: the
        ``traceparent`` of the run's span (``RunState.trace``); ``priority``: its place in
        the admission queue (``RunState.priority``)."""
        self.plans.add(plan)
        state = new_run_state(
            run_id=run_id,
            workflow=plan.name,
            version=plan.version,
            plan_hash=plan.hash,
            created_at=self._clock.now(),
            parent_run_id=parent,
            parent_step_key=parent_step,
            trace=trace,
            priority=priority,
        )
        state.input = input
        stored_id, created = await self.creating((state, idempotency_key))
        return stored_id, state if created else None


def unknown_workflow(name: str, version: str | None) -> NotFound:
    """The error for a workflow no definition of which is registered: the same whatever
    the name looks like and whatever files exist (it says nothing but the name)."""
    which = f"{name!r} version {version}" if version else repr(name)
    return NotFound(
        f"no definition {which} is registered: register the definition first "
        "(`tideflow definitions register FILE`, POST /definitions)"
    )


def started_event(state: RunState, now: float) -> RunStarted:
    """The event that starts a stored pending run (one id per run: sent twice, applied once)."""
    return RunStarted(
        event_id=f"{state.run_id}:started",
        run_id=state.run_id,
        time=now,
        input=state.input,
        parent_run_id=state.parent_run_id,
        parent_step_key=state.parent_step_key,
    )
