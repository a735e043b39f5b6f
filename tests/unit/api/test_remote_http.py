"""`HttpClient` against a real uvicorn on a free loopback port over an embedded runtime,
with real API tokens: every method, and problems mapped back to tideflow's exceptions."""

from __future__ import annotations

import socket
import textwrap
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest

from tideflow import errors
from tideflow.api.auth import issue_token
from tideflow.api.serving import address_of, http_api, listen
from tideflow.lifecycle import Stop
from tideflow.model.states import RunStatus, SignalOutcome
from tideflow.model.tokens import Role
from tideflow.remote_http import (
    PROBLEM_CLASSES,
    HttpClient,
    RemoteProblem,
    ServerUnreachable,
    compiled_here,
)
from tideflow.runtime.runtime import Runtime
from tideflow.store.base import RunFilter
from tideflow.testing.waiting import step_is, wait_until
from tideflow.worker.executors.functions import register, unregister

ROOT = Path(__file__).resolve().parents[3]
WAITING = textwrap.dedent(
    """
    name: waiting
    version: "1"
    input:
      type: object
      required: [order_id]
      properties: {order_id: {type: string}}
    steps:
      - {id: ask, type: wait, signal: go}
      - {id: after, type: noop, depends_on: [ask]}
    output: "{{ steps.ask.output }}"
    """
)
HELLO = {"name": "hello", "version": "1", "steps": [{"id": "a", "type": "noop"}]}
BREAKING = {
    "name": "breaking",
    "version": "1",
    "steps": [{"id": "boom", "type": "python", "function": "remote_test.boom"}],
}


@dataclass
class Served:
    rt: Runtime
    url: str
    admin: str
    viewer: str


@pytest.fixture(autouse=True)
def boom() -> Iterator[None]:
    @register("remote_test.boom")
    def failing() -> None:
        raise ValueError("broken on purpose")

    yield
    unregister("remote_test.boom")


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    sock = listen("127.0.0.1", 0)
    async with Runtime(workers=1) as rt:
        admin = await issue_token(rt.client.store, name="admin", role=Role.ADMIN, now=0.0)
        viewer = await issue_token(rt.client.store, name="viewer", role=Role.VIEWER, now=0.0)
        async with http_api(rt.client, Stop(), sock):
            yield Served(rt, address_of(sock), admin.value, viewer.value)


async def test_every_method_over_http(served: Served, tmp_path: Path) -> None:
    async with HttpClient(served.url, token=served.admin, poll_max=0.2) as c:
        path = tmp_path / "waiting.yaml"
        path.write_text(WAITING)
        registered = await c.register(path)
        assert (registered.name, registered.version, registered.steps) == (
            "waiting",
            "1",
            ["ask", "after"],
        )
        assert (await c.register(HELLO)).name == "hello"
        assert (await c.register(textwrap.dedent(WAITING))).hash == registered.hash
        assert [(d.name, d.version, d.active) for d in await c.definitions()] == [
            ("hello", "1", True),
            ("waiting", "1", True),
        ]
        assert [d.name for d in await c.definitions("hello")] == ["hello"]
        shown = await c.definition("waiting")
        assert shown.hash == registered.hash and shown.source is not None
        assert shown.source["name"] == "waiting"

        run_id, created = await c.launch("waiting", {"order_id": "A1"}, idempotency_key="k")
        assert created
        assert await c.launch("waiting", {"order_id": "A1"}, idempotency_key="k") == (
            run_id,
            False,
        )
        with pytest.raises(TimeoutError, match=run_id):
            await c.wait(run_id, timeout=0.3)
        assert await c.signal(run_id, "go", {"ok": True}, signal_id="s1") is (
            SignalOutcome.DELIVERED
        )
        result = await c.wait(run_id, timeout=30)
        assert result.status == "succeeded" and result.output == {"ok": True}
        assert result.steps["ask"].status == "succeeded"
        assert (await c.get(run_id)).run_id == run_id
        assert await c.signal(run_id, "go") is SignalOutcome.UNMATCHED
        assert await c.cancel(run_id) is RunStatus.SUCCEEDED
        kinds = [e.kind for e in await c.history(run_id)]
        assert kinds[0] == "run_started" and "signal_received" in kinds
        assert all(e.run_id == run_id for e in await c.history(run_id))

        other = await c.start("waiting", {"order_id": "B2"})
        assert await c.cancel(other, "no longer needed") in (RunStatus.PENDING, RunStatus.RUNNING)
        assert (await c.wait(other, timeout=30)).status == "cancelled"

        first = await c.list(limit=1)
        assert len(first.runs) == 1 and first.next_cursor is not None
        second = await c.list(limit=1, cursor=first.next_cursor)
        assert {first.runs[0].run_id, second.runs[0].run_id} == {run_id, other}
        done = await c.list(RunFilter(status="succeeded"))
        assert [r.run_id for r in done.runs] == [run_id] and done.next_cursor is None

        assert await c.activate("hello", "1", False) is True
        assert await c.activate("hello", "1", False) is False
        with pytest.raises(errors.DefinitionInactive):
            await c.start("hello", version="1")
        assert await c.activate("hello", "1") is True

        await c.register(BREAKING)
        broken = await c.start("breaking")
        assert (await c.wait(broken, timeout=30)).status == "failed"
        assert await c.retry(broken, "again") in (RunStatus.RUNNING, RunStatus.PENDING)

        assert isinstance(await c.queues(), list)
        assert all(b.live for b in await c.worker_beats())


async def test_problems_become_the_servers_exceptions(served: Served) -> None:
    async with HttpClient(served.url, token=served.admin) as c:
        await c.register(WAITING)
        await c.register(HELLO)
        with pytest.raises(errors.NotFound):
            await c.get("nope")
        with pytest.raises(errors.NotFound):
            await c.definition("nobody")
        with pytest.raises(errors.DefinitionConflict):
            await c.register({**HELLO, "steps": [{"id": "b", "type": "noop"}]})
        with pytest.raises(errors.DefinitionError) as invalid:
            await c.register({"name": "bad", "version": "1", "steps": [{"id": "x"}]})
        assert invalid.value.diagnostics and invalid.value.diagnostics[0].path
        with pytest.raises(errors.InputValidationError) as wrong:
            await c.start("waiting", {"order_id": 7})
        assert wrong.value.fields and wrong.value.fields[0][0].startswith("$")
        run_id = await c.start("waiting", {"order_id": "A1"})
        with pytest.raises(errors.UnknownSignal):
            await c.signal(run_id, "never")
        with pytest.raises(errors.RunNotRetryable):
            await c.retry(run_id)
        with pytest.raises(RemoteProblem) as shape:
            await c.list(limit=0)
        assert shape.value.status == 422 and "query.limit" in shape.value.message
    async with HttpClient(served.url, token=served.viewer) as viewer:
        assert await viewer.definitions()
        with pytest.raises(errors.Forbidden):
            await viewer.start("hello")
    for token in (None, "tf_nope_nope"):
        async with HttpClient(served.url, token=token) as anonymous:
            with pytest.raises(errors.Unauthenticated, match="Bearer"):
                await anonymous.list()


def test_every_problem_type_names_the_most_general_class() -> None:
    assert PROBLEM_CLASSES["urn:tideflow:problem:unauthenticated"] is errors.Unauthenticated
    assert PROBLEM_CLASSES["urn:tideflow:problem:definition-invalid"] is errors.DefinitionError
    assert PROBLEM_CLASSES["urn:tideflow:problem:internal"] is errors.TideflowError


async def test_a_server_that_is_not_there_is_named() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    async with HttpClient(url, timeout=5) as c:
        with pytest.raises(ServerUnreachable, match=f"127.0.0.1:{port}"):
            await c.list()
    with pytest.raises(ValueError, match="http"):
        HttpClient("127.0.0.1:8080")


async def test_a_start_names_its_run_and_a_taken_id_is_refused(served: Served) -> None:
    async with HttpClient(served.url, token=served.admin) as c:
        await c.register(WAITING)
        assert await c.start("waiting", {"order_id": "A1"}, run_id="order-A1") == "order-A1"
        with pytest.raises(errors.RunExists, match="order-A1"):
            await c.start("waiting", {"order_id": "B2"}, run_id="order-A1")
        assert (await served.rt.client.state("order-A1")).input == {"order_id": "A1"}
        await wait_until(served.rt, "order-A1", step_is("ask", "waiting"))
        why = await c.why("order-A1")
        assert why.run_id == "order-A1" and why.status == "running"
        assert [(r.kind.value, r.step) for r in why.reasons] == [
            ("waiting_for_signal", "ask"),
            ("join", "after"),
        ]
        with pytest.raises(RemoteProblem) as shape:  # not a path segment: refused by the API
            await c.start("waiting", {"order_id": "C3"}, run_id="../etc")
        assert shape.value.status == 422 and "run_id" in shape.value.message


async def test_a_python_definition_is_compiled_here_and_registered_there(
    served: Served,
) -> None:
    builder = ROOT / "examples" / "python_builder.py"
    async with HttpClient(served.url, token=served.admin) as c:
        registered = await c.register(builder)
        assert (registered.name, registered.version) == ("python-builder", "1.0.0")
        local = compiled_here(builder)
        assert registered.hash == local.hash  # the server compiled the same definition
        run_id = await c.start(local, {"name": "Ada", "words": ["tide", "flow"]}, run_id="ada")
        assert run_id == "ada"
        result = await c.wait(run_id, timeout=30)
        assert result.status == "succeeded", result
        assert result.output == {"text": "Hello, Ada! You gave 2 words, 8 letters."}


class Recorded(httpx.AsyncHTTPTransport):
    """The requests an `HttpClient` sends: (method, path, JSON body or None)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, str, object]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        json_body = request.headers.get("content-type") == "application/json"
        body = orjson.loads(request.content) if json_body and request.content else None
        self.sent.append((request.method, request.url.path, body))
        return await super().handle_async_request(request)


async def test_a_definition_file_is_read_here_registered_then_started_by_name(
    served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server starts by name only: a file given to `launch` is read on this machine
    and registered (POST /definitions), and the run started by its name and version."""
    (tmp_path / "waiting.yaml").write_text(WAITING)
    monkeypatch.chdir(tmp_path)
    recorded = Recorded()
    async with HttpClient(served.url, token=served.admin, transport=recorded) as c:
        run_id, created = await c.launch("waiting.yaml", {"order_id": "A1"})
    assert created
    assert [(method, path) for method, path, _ in recorded.sent] == [
        ("POST", "/definitions"),
        ("POST", "/runs"),
    ]
    assert recorded.sent[1][2] == {
        "workflow": "waiting",
        "version": "1",
        "input": {"order_id": "A1"},
    }
    assert (await served.rt.client.state(run_id)).workflow == "waiting"


async def test_a_file_without_a_token_that_may_register_says_what_to_do(
    served: Served, tmp_path: Path
) -> None:
    path = tmp_path / "waiting.yaml"
    path.write_text(WAITING)
    async with HttpClient(served.url, token=served.viewer) as c:
        with pytest.raises(errors.Forbidden) as refused:
            await c.launch(str(path), {"order_id": "A1"})
    message = refused.value.message
    assert "may not" in message  # what the server said
    assert "tideflow definitions register FILE --server URL" in message
    assert "start it by its name" in message
    assert await served.rt.client.definitions() == []


async def test_a_missing_file_is_an_error_here_and_nothing_is_sent(
    served: Served, tmp_path: Path
) -> None:
    recorded = Recorded()
    async with HttpClient(served.url, token=served.admin, transport=recorded) as c:
        for missing in (str(tmp_path / "missing.yaml"), "missing.json"):
            with pytest.raises(errors.DefinitionUnreadable, match="missing"):
                await c.launch(missing)
    assert recorded.sent == []


async def test_a_path_sent_as_a_name_is_refused_by_the_server(
    served: Served, tmp_path: Path
) -> None:
    path = tmp_path / "waiting.yaml"
    path.write_text(WAITING)
    async with HttpClient(served.url, token=served.admin) as c:
        with pytest.raises(RemoteProblem) as refused:
            await c.launch_registered(str(path), {"order_id": "A1"})
        with pytest.raises(errors.NotFound, match=r"no definition 'waiting\.yaml' is registered"):
            await c.launch_registered("waiting.yaml", {"order_id": "A1"})
    assert refused.value.status == 422 and "workflow" in refused.value.message
    assert WAITING.strip().splitlines()[0] not in refused.value.message
    assert await served.rt.client.definitions() == []
