"""A client of a `tideflow server`'s HTTP API (docs/api.md), with the `Client`'s methods.

::

    async with HttpClient("http://tideflow:8080", token="tf_…") as client:
        run_id = await client.start("order-fulfillment", {"order_id": "A1"})
        await client.signal(run_id, "approval", {"approved": True})
        result = await client.wait(run_id, timeout=60)

Method names, arguments and return types are those of `tideflow.client.Client` (a
`RunResult`, a `RunPage` with its cursor, `HistoryEntry` rows, `QueueStats`, a
`SignalOutcome`, a `RunStatus`), except ``register`` and ``definition``: they return a
`RemoteDefinition` (name, version, hash, step ids and, from ``definition``, the normalised
source), not a compiled `Plan`.

Every problem the server answers with becomes the tideflow exception it was raised from
on the server: `api.problems.ERRORS` read in reverse (problem ``type`` → the most general
class of its row), so ``NotFound``, ``DefinitionConflict``, ``InputValidationError`` …
are caught as they are with a local client. A problem no row names (FastAPI's request
validation, 413, 405) is a `RemoteProblem`; a server that cannot be reached is
`ServerUnreachable`, naming the URL.

``wait`` polls ``GET /runs/{id}``: first after ``poll_min`` seconds, then twice as long
each time up to ``poll_max`` (defaults 0.05 and 1.0), until the run is terminal or
``timeout`` passes (``TimeoutError``, as `Client.wait`).
"""

from __future__ import annotations

import asyncio
import builtins
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from tideflow import errors
from tideflow.api.problem_types import ERRORS, TYPE_PREFIX
from tideflow.bus.base import QueueStats, WorkerBeat
from tideflow.errors import Diagnostic, RemoteProblem, ServerUnreachable, TideflowError
from tideflow.model.plan import Plan, Priority
from tideflow.model.run import run_priority
from tideflow.model.states import RUN_TERMINAL, RunStatus, SignalOutcome
from tideflow.model.versions import version_key
from tideflow.runtime.result import RunResult, StepResult
from tideflow.runtime.why import Diagnosis
from tideflow.store.base import DefinitionSummary, HistoryEntry, RunFilter, RunPage, RunSummary

__all__ = ["HttpClient", "RemoteDefinition", "RemoteProblem", "ServerUnreachable"]

DEFAULT_TIMEOUT = 30.0
YAML = "application/yaml"


def _reverse() -> dict[str, type[TideflowError]]:
    """Problem type → the class of its rows that every other class of them derives from
    (its first row when none does)."""
    by_kind: dict[str, builtins.list[type[TideflowError]]] = {}
    for cls, (_, kind) in ERRORS.items():
        by_kind.setdefault(kind, []).append(cls)
    chosen: dict[str, type[TideflowError]] = {}
    for kind, classes in by_kind.items():
        bases = [c for c in classes if all(issubclass(o, c) for o in classes)]
        chosen[TYPE_PREFIX + kind] = bases[0] if bases else classes[0]
    return chosen


PROBLEM_CLASSES: Mapping[str, type[TideflowError]] = _reverse()
"""The tideflow error each problem ``type`` of `api.problems.ERRORS` is raised as."""


def error_of(status: int, body: Any, url: str) -> TideflowError:
    """The exception for an error response (a problem, or any other body)."""
    problem: Mapping[str, Any] = body if isinstance(body, Mapping) else {}
    kind = str(problem.get("type", ""))
    detail = str(problem.get("detail") or problem.get("title") or f"HTTP {status} from {url}")
    fields = [f for f in problem.get("errors") or [] if isinstance(f, Mapping)]
    cls = PROBLEM_CLASSES.get(kind)
    if cls is None:
        named = "; ".join(f"{f.get('field')}: {f.get('message')}" for f in fields)
        return RemoteProblem(f"{detail} ({named})" if named else detail, status, kind, problem)
    if issubclass(cls, errors.DefinitionError):
        diagnostics = [
            Diagnostic(
                message=str(f.get("message")),
                path=str(f["field"]).removeprefix("body").lstrip(".") or None,
                line=f.get("line"),
                column=f.get("column"),
                step_id=f.get("step_id"),
                hint=f.get("hint"),
            )
            for f in fields
        ]
        return cls(diagnostics or detail)
    if issubclass(cls, errors.InputValidationError):
        pairs = [
            ("$" + str(f["field"]).removeprefix("body.input"), str(f.get("message")))
            for f in fields
            if str(f.get("field", "")).startswith("body.input")
        ]
        return cls(detail, fields=pairs)
    return cls(detail)


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoteDefinition:
    """A registered definition as the API shows it (``register``, ``definition``)."""

    name: str
    version: str
    hash: str
    steps: builtins.list[str]
    source: dict[str, Any] | None = None
    """The normalised definition (``definition`` only)."""
    title: str | None = None
    """Its ``title:``, if it has one."""


class HttpClient:
    """The `Client` of a remote server (module docstring). ``timeout``: seconds for each
    HTTP request; ``token``: an API token, sent as ``Authorization: Bearer``;
    ``tracer_provider`` (OpenTelemetry, the ``otel`` extra): each request carries the W3C
    context of the span current when it is made, so the runs it starts join the caller's
    trace and its signals, cancels and retries are spans there (docs/observability.md)."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        poll_min: float = 0.05,
        poll_max: float = 1.0,
        transport: httpx.AsyncBaseTransport | None = None,
        tracer_provider: Any = None,
    ) -> None:
        from tideflow.observability.tracing import Tracing

        self._tracing = None if tracer_provider is None else Tracing(tracer_provider)
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--server {url!r}: give an http:// or https:// URL")
        if not 0 < poll_min <= poll_max:
            raise ValueError("poll_min must be > 0 and at most poll_max")
        self.url = url.rstrip("/")
        self.poll_min = poll_min
        self.poll_max = poll_max
        # times as epoch seconds, what this client computes with (api/times.py); a server
        # from before ISO 8601 times ignores the header and writes them so anyway
        headers = {"tideflow-times": "epoch"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        self._http = httpx.AsyncClient(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )

    async def __aenter__(self) -> HttpClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Any:
        where = self.url + path
        if method not in ("GET", "HEAD") and content is None:
            # the server refuses a request that changes something without a JSON
            # Content-Type, even with no body (api/browsers.py)
            headers = {"content-type": "application/json", **(headers or {})}
        if self._tracing is not None:
            headers = {**(headers or {}), **self._tracing.current_headers()}
        try:
            response = await self._http.request(
                method,
                path,
                json=json,
                content=content,
                headers=headers,
                params={k: v for k, v in (params or {}).items() if v is not None},
            )
        except httpx.TimeoutException as exc:
            raise ServerUnreachable(
                f"{method} {where}: no answer in time ({type(exc).__name__}); raise --timeout "
                "or check the server"
            ) from None
        except httpx.TransportError as exc:
            raise ServerUnreachable(
                f"cannot reach the tideflow server at {self.url}: {exc or type(exc).__name__}"
            ) from None
        try:
            body = response.json() if response.content else None
        except ValueError:
            body = None
        if response.is_error:
            raise error_of(response.status_code, body, where)
        return body

    # -- definitions ------------------------------------------------------------

    async def register(self, definition: Mapping[str, Any] | str | Path | Any) -> RemoteDefinition:
        """Register a definition: a mapping, YAML text, the path of a file (read here,
        sent as its text), or a Plan, Workflow builder or Python definition file
        (``flow.py[:name]``), compiled here and sent as its normalised definition (the
        server compiles it again: its ``python`` steps must import on the workers)."""
        from tideflow.runtime.definitions import is_python_reference

        if not isinstance(definition, Mapping | str | Path) or is_python_reference(
            definition, files_only=True
        ):
            definition = compiled_here(definition).source
        if isinstance(definition, Mapping):
            body = await self._call("POST", "/definitions", json=dict(definition))
        else:
            text = _text_of(definition)
            body = await self._call(
                "POST", "/definitions", content=text.encode(), headers={"content-type": YAML}
            )
        return _definition(body)

    async def definitions(self, name: str | None = None) -> builtins.list[DefinitionSummary]:
        body = await self._call("GET", "/definitions", params={"name": name})
        return [DefinitionSummary(**row) for row in body["definitions"]]

    async def definition(self, name: str, version: str | None = None) -> RemoteDefinition:
        """By name and version; without a version, the one `Client.definition` picks (the
        highest active one, or the highest of all when none is active)."""
        if version is None:
            rows = await self.definitions(name)
            if not rows:
                raise errors.NotFound(f"no definition named {name!r} is registered")
            active = [r for r in rows if r.active] or rows
            version = max((r.version for r in active), key=version_key)
        return _definition(await self._call("GET", f"/definitions/{_seg(name)}/{_seg(version)}"))

    async def activate(self, name: str, version: str, active: bool = True) -> bool:
        verb = "activate" if active else "deactivate"
        body = await self._call("POST", f"/definitions/{_seg(name)}/{_seg(version)}/{verb}")
        return bool(body["changed"])

    # -- schedules (docs/schedules.md) ------------------------------------------

    async def schedules(self, workflow: str | None = None) -> builtins.list[dict[str, Any]]:
        """The schedules as ``GET /schedules`` shows them (``tideflow schedules list
        --json``'s rows; times ISO 8601 UTC)."""
        body = await self._call("GET", "/schedules", params={"workflow": workflow})
        return [dict(row) for row in body["schedules"]]

    async def create_schedule(self, workflow: str, schedule: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /schedules``: the schedule made, as ``schedules`` shows it."""
        body = await self._call(
            "POST", "/schedules", json={"workflow": workflow, "schedule": dict(schedule)}
        )
        return dict(body)

    async def pause_schedule(self, workflow: str, schedule_id: str) -> bool:
        return await self._schedule_change(workflow, schedule_id, "pause")

    async def resume_schedule(self, workflow: str, schedule_id: str) -> bool:
        return await self._schedule_change(workflow, schedule_id, "resume")

    async def trigger_schedule(self, workflow: str, schedule_id: str) -> str:
        path = f"/schedules/{_seg(workflow)}/{_seg(schedule_id)}/trigger"
        return str((await self._call("POST", path))["run_id"])

    async def delete_schedule(self, workflow: str, schedule_id: str) -> None:
        await self._call("DELETE", f"/schedules/{_seg(workflow)}/{_seg(schedule_id)}")

    async def _schedule_change(self, workflow: str, schedule_id: str, verb: str) -> bool:
        body = await self._call("POST", f"/schedules/{_seg(workflow)}/{_seg(schedule_id)}/{verb}")
        return bool(body["changed"])

    # -- starting and steering runs ---------------------------------------------

    async def start(
        self,
        workflow: str | Plan | Any,
        input: Any = None,
        *,
        version: str | None = None,
        run_id: str | None = None,
        idempotency_key: str | None = None,
        priority: Priority | str | None = None,
    ) -> str:
        started, _ = await self.launch(
            workflow,
            input,
            version=version,
            run_id=run_id,
            idempotency_key=idempotency_key,
            priority=priority,
        )
        return started

    async def launch(
        self,
        workflow: str | Plan | Any,
        input: Any = None,
        *,
        version: str | None = None,
        run_id: str | None = None,
        idempotency_key: str | None = None,
        priority: Priority | str | None = None,
    ) -> tuple[str, bool]:
        """``start``, saying whether a run was created. ``workflow`` is a registered
        name, or (as for `Client.start`) a Plan, a Workflow builder or a definition file
        of this machine (``flow.yaml``, ``flow.py[:name]``: read or compiled here),
        registered first (the same content again changes nothing; it needs a token that
        may register) and started at its version. The server itself only ever starts a
        workflow by its registered name: it never reads a file a request names."""
        from tideflow.runtime.definitions import DefinitionSource

        if not isinstance(workflow, str) or DefinitionSource.looks_like_path(workflow):
            registered = await self.register_for_start(workflow)
            workflow, version = registered.name, registered.version
        return await self.launch_registered(
            workflow,
            input,
            version=version,
            run_id=run_id,
            idempotency_key=idempotency_key,
            priority=priority,
        )

    async def launch_registered(
        self,
        name: str,
        input: Any = None,
        *,
        version: str | None = None,
        run_id: str | None = None,
        idempotency_key: str | None = None,
        priority: Priority | str | None = None,
    ) -> tuple[str, bool]:
        """``POST /runs``: a run of the workflow registered as ``name`` (as
        `Client.launch_registered`; a name that is no workflow name is a `RemoteProblem`
        422, an unknown one `NotFound`)."""
        request: dict[str, Any] = {"workflow": name, "input": input}
        for key, value in (
            ("version", version),
            ("run_id", run_id),
            ("idempotency_key", idempotency_key),
            ("priority", None if priority is None else run_priority(priority).value),
        ):
            if value is not None:
                request[key] = value
        body = await self._call("POST", "/runs", json=request)
        return str(body["run_id"]), bool(body["created"])

    async def register_for_start(self, definition: Any) -> RemoteDefinition:
        """``register`` a definition so as to start it by name (what ``launch`` does with
        a file): a token that may not register is told how to start it instead."""
        try:
            return await self.register(definition)
        except errors.Forbidden as exc:
            raise errors.Forbidden(
                f"{exc.message}. A definition file is started over HTTP by registering it "
                "first: register it with an admin token (`tideflow definitions register "
                "FILE --server URL`), then start it by its name"
            ) from None

    async def why(self, run_id: str) -> Diagnosis:
        """Why the run is where it is, as the server sees it (runtime/why.py)."""
        return Diagnosis.of(await self._call("GET", f"/runs/{_seg(run_id)}/why"))

    async def signal(
        self, run_id: str, name: str, payload: Any = None, *, signal_id: str | None = None
    ) -> SignalOutcome:
        request: dict[str, Any] = {"name": name, "payload": payload}
        if signal_id is not None:
            request["signal_id"] = signal_id
        body = await self._call("POST", f"/runs/{_seg(run_id)}/signals", json=request)
        return SignalOutcome(body["status"])

    async def cancel(self, run_id: str, reason: str = "cancelled on request") -> RunStatus:
        body = await self._call("POST", f"/runs/{_seg(run_id)}/cancel", json={"reason": reason})
        return RunStatus(body["status"])

    async def retry(self, run_id: str, reason: str = "retried on request") -> RunStatus:
        body = await self._call("POST", f"/runs/{_seg(run_id)}/retry", json={"reason": reason})
        return RunStatus(body["status"])

    # -- reading runs -----------------------------------------------------------

    async def get(self, run_id: str) -> RunResult:
        body = await self._call("GET", f"/runs/{_seg(run_id)}")
        return _result(body)

    async def summary(self, run_id: str) -> RunSummary:
        """The run's summary row (read from ``GET /runs/{id}``); ``NotFound``."""
        body = await self._call("GET", f"/runs/{_seg(run_id)}")
        return RunSummary(
            run_id=body["run_id"],
            workflow=body["workflow"],
            version=body["version"],
            status=body["status"],
            created_at=body["created_at"],
            updated_at=body["updated_at"],
            finished_at=body["finished_at"],
            parent_run_id=body["parent_run_id"],
            output=body["output"],
            error=body["error"],
            title=body.get("title"),
        )

    @property
    def delivered_to(self) -> None:
        """Always None: the server applies what this client sends (as `Client`'s)."""
        return None

    async def list(
        self, filter: RunFilter | None = None, *, limit: int = 100, cursor: str | None = None
    ) -> RunPage:
        f = filter or RunFilter()
        params = {
            "status": f.status,
            "workflow": f.workflow,
            "created_after": f.created_after,
            "created_before": f.created_before,
            "limit": limit,
            "cursor": cursor,
        }
        body = await self._call("GET", "/runs", params=params)
        return RunPage(
            runs=[RunSummary(**row) for row in body["runs"]], next_cursor=body["next_cursor"]
        )

    async def history(self, run_id: str) -> builtins.list[HistoryEntry]:
        body = await self._call("GET", f"/runs/{_seg(run_id)}/history")
        rows = body["events"] if "events" in body else body["entries"]  # before: `entries`
        return [HistoryEntry(run_id=body["run_id"], **row) for row in rows]

    async def wait(self, run_id: str, timeout: float | None = None) -> RunResult:
        """Poll the run until it is terminal (module docstring); ``TimeoutError``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = self.poll_min
        while True:
            result = await self.get(run_id)
            if result.status in RUN_TERMINAL:
                return result
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"run {run_id} is still {result.status} after {timeout} s")
                pause = min(pause, left)
            await asyncio.sleep(pause)
            pause = min(pause * 2, self.poll_max)

    async def queues(self) -> builtins.list[QueueStats]:
        body = await self._call("GET", "/queues")
        return [
            QueueStats(
                queue=row["queue"],
                priority=Priority(row["priority"]),
                depth=row["depth"],
                held=row["held"],
                oldest_age=row["oldest_age"],
                consumers=row["consumers"],
            )
            for row in body["queues"]
        ]

    async def worker_beats(self) -> builtins.list[WorkerBeat]:
        """The workers reading the server's bus, with their last heartbeat (``GET /workers``)."""
        body = await self._call("GET", "/workers")
        return [
            WorkerBeat(
                worker=row["worker"],
                queues=None if row["queues"] is None else tuple(row["queues"]),
                last_beat=row["last_beat"],
                live=row["live"],
            )
            for row in body["workers"]
        ]


def _result(body: Mapping[str, Any]) -> RunResult:
    return RunResult(
        run_id=body["run_id"],
        workflow=body["workflow"],
        version=body["version"],
        status=body["status"],
        output=body["output"],
        error=body["error"],
        steps={key: StepResult(**step) for key, step in body["steps"].items()},
        compensation=body["compensation"],
    )


def _seg(part: str) -> str:
    """One URL path segment (a run id or a name with a ``/`` in it stays one)."""
    from urllib.parse import quote

    return quote(part, safe="")


def compiled_here(definition: Any) -> Plan:
    """A Plan, Workflow builder or Python definition file compiled in this process, with
    the executors of this installation (their action schemas check the steps)."""
    from tideflow.runtime.definitions import coerce_plan
    from tideflow.worker.executors.registry import ExecutorRegistry

    return coerce_plan(definition, ExecutorRegistry())


def _text_of(definition: str | Path) -> str:
    """The YAML text of a definition: a path's file read here (the server cannot see it,
    and never reads a file a request names); a name of a missing definition file
    (``flow.yaml``) is an error here rather than text sent to the server."""
    from tideflow.runtime.definitions import DefinitionSource

    if isinstance(definition, str) and DefinitionSource.looks_like_path(definition):
        definition = Path(definition)
    if isinstance(definition, Path) or ("\n" not in definition and Path(definition).is_file()):
        path = Path(definition)
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise errors.DefinitionUnreadable(f"cannot read {path}: {exc}") from None
    return definition


def _definition(body: Mapping[str, Any]) -> RemoteDefinition:
    return RemoteDefinition(
        name=body["name"],
        version=body["version"],
        hash=body["hash"],
        steps=list(body["steps"]),
        source=body.get("source"),
        title=body.get("title"),
    )
