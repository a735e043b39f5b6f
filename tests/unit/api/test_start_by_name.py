"""`POST /runs` starts a workflow by its registered name only (issue 26): an operator
token that names a file of the server's disk (a Python file whose import would write a
marker, a YAML file whose `shell` step would, a JSON file, a path that does not exist)
imports nothing, registers nothing, starts nothing, echoes no file content, and gets the
same answer for all of them. A subflow's `workflow:` is a name too. On SQLite and
PostgreSQL, over an embedded runtime's client with real API tokens."""

from __future__ import annotations

import json
import sys
import textwrap
import threading
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from tideflow.api import create_app
from tideflow.api.auth import issue_token
from tideflow.model.tokens import Role
from tideflow.runtime.definitions import DefinitionSource
from tideflow.runtime.runtime import Runtime

MODULE = "start_by_name_probe"
"""The Python file's module name: its import would put it in sys.modules."""
SECRET = "file-content-7c1d9e"
"""In every file: it must never be in an answer."""
HELLO = {"name": "hello", "version": "1", "steps": [{"id": "a", "type": "noop"}]}


@dataclass
class Disk:
    """Files of the server's disk a request names, and the markers their code would write."""

    root: Path
    py_marker: Path
    yaml_marker: Path

    @property
    def markers(self) -> list[Path]:
        return [self.py_marker, self.yaml_marker]

    def names(self) -> dict[str, str]:
        """Each kind of file: its name relative to the server's working directory."""
        return {
            "py": f"{MODULE}.py",
            "yaml": "probe.yaml",
            "json": "probe.json",
            "missing": "missing.yaml",
        }


@pytest.fixture
def disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Disk:
    root = tmp_path / "server-disk"
    root.mkdir()
    disk = Disk(root, tmp_path / "imported.marker", tmp_path / "shell.marker")
    (root / f"{MODULE}.py").write_text(
        textwrap.dedent(
            f"""
            from pathlib import Path
            from tideflow import Workflow

            Path({str(disk.py_marker)!r}).write_text("imported")
            SECRET = {SECRET!r}
            workflow = Workflow("probe-py", "1").step("a", type="noop")
            """
        )
    )
    (root / "probe.yaml").write_text(
        textwrap.dedent(
            f"""
            name: probe-yaml
            version: "1"
            description: {SECRET}
            steps:
              - {{id: run, type: shell, command: [touch, {str(disk.yaml_marker)!r}]}}
            """
        )
    )
    probe = {**HELLO, "name": "probe-json", "description": SECRET}
    (root / "probe.json").write_text(json.dumps(probe))
    monkeypatch.chdir(root)  # a relative name would be read from here
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    return disk


@pytest.fixture(params=["sqlite", "postgres"])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    base = request.getfixturevalue("postgres_url")
    schema = f"names_{uuid.uuid4().hex[:12]}"
    yield f"{base}?schema={schema}"
    conn = await asyncpg.connect(base)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


@dataclass
class Server:
    rt: Runtime
    operator: httpx.AsyncClient

    async def state(self) -> tuple[object, ...]:
        """What a start could change: the definitions and the runs."""
        definitions = [(d.name, d.version, d.hash) for d in await self.rt.client.definitions()]
        runs = [r.run_id for r in (await self.rt.client.list(limit=1000)).runs]
        return definitions, runs


@pytest.fixture
async def server(store_url: str) -> AsyncIterator[Server]:
    async with Runtime(store=store_url, workers=1) as rt:
        await rt.register(HELLO)
        token = await issue_token(rt.client.store, name="ops", role=Role.OPERATOR, now=0.0)
        transport = httpx.ASGITransport(app=create_app(rt.client))
        headers = {"authorization": f"Bearer {token.value}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://api", headers=headers
        ) as operator:
            yield Server(rt, operator)


def untouched(disk: Disk) -> None:
    """No file's code ran, and the Python file was not imported."""
    assert [m for m in disk.markers if m.exists()] == []
    assert MODULE not in sys.modules


def same_answers(answers: dict[str, httpx.Response], names: dict[str, str]) -> dict[str, Any]:
    """Every answer is one answer (the name given aside), with no file content in it."""
    bodies = {}
    for kind, response in answers.items():
        assert SECRET not in response.text
        assert "no such file" not in response.text
        bodies[kind] = (response.status_code, response.text.replace(names[kind], "NAME"))
    first = next(iter(bodies.values()))
    assert all(body == first for body in bodies.values()), bodies
    return dict(answers["missing"].json())


async def test_a_path_on_the_server_is_not_a_workflow_name(server: Server, disk: Disk) -> None:
    before = await server.state()
    paths = {kind: str(disk.root / name) for kind, name in disk.names().items()}
    answers = {
        kind: await server.operator.post("/runs", json={"workflow": path, "input": {}})
        for kind, path in paths.items()
    }
    body = same_answers(answers, paths)
    assert answers["py"].status_code == 422
    assert body["type"] == "urn:tideflow:problem:request-invalid"
    [error] = body["errors"]
    assert error["field"] == "body.workflow"
    assert "registered workflow" in error["message"]
    assert "tideflow definitions register FILE" in error["message"]
    untouched(disk)
    assert await server.state() == before


async def test_a_file_name_is_looked_up_as_a_name_only(server: Server, disk: Disk) -> None:
    """``probe.yaml`` is a valid workflow name: it is looked for among the registered
    definitions, never read from the server's working directory."""
    before = await server.state()
    names = disk.names()
    answers = {
        kind: await server.operator.post("/runs", json={"workflow": name})
        for kind, name in names.items()
    }
    body = same_answers(answers, names)
    assert answers["yaml"].status_code == 404
    assert body["type"] == "urn:tideflow:problem:not-found"
    assert body["detail"].startswith("no definition 'missing.yaml' is registered")
    versioned = await server.operator.post("/runs", json={"workflow": "probe.yaml", "version": "1"})
    assert versioned.status_code == 404
    assert versioned.json()["detail"].startswith("no definition 'probe.yaml' version 1 is")
    untouched(disk)
    assert await server.state() == before


async def test_a_python_reference_and_a_way_out_are_refused_alike(
    server: Server, disk: Disk
) -> None:
    before = await server.state()
    refused = [
        await server.operator.post("/runs", json={"workflow": workflow})
        for workflow in (
            f"{MODULE}.py:workflow",
            f"{disk.root}/{MODULE}.py:workflow",
            "../server-disk/probe.yaml",
            "Probe.YAML",
            f"{MODULE}",  # a module name is a name: not registered
        )
    ]
    assert [r.status_code for r in refused] == [422, 422, 422, 422, 404]
    assert all(SECRET not in r.text for r in refused)
    untouched(disk)
    assert await server.state() == before


async def test_a_registered_name_still_starts(server: Server, disk: Disk) -> None:
    started = await server.operator.post("/runs", json={"workflow": "hello"})
    assert started.status_code == 201, started.text
    result = await server.rt.wait(started.json()["run_id"], timeout=30)
    assert result.status == "succeeded"


async def test_a_workflow_registered_under_a_file_like_name_starts_by_it(
    server: Server, disk: Disk
) -> None:
    """A name that looks like a file is a name: the registered one starts, the file of
    the same name in the working directory is not read."""
    await server.rt.register({**HELLO, "name": "probe.yaml"})
    started = await server.operator.post("/runs", json={"workflow": "probe.yaml"})
    assert started.status_code == 201, started.text
    result = await server.rt.wait(started.json()["run_id"], timeout=30)
    assert (result.status, result.workflow) == ("succeeded", "probe.yaml")
    untouched(disk)


async def test_a_subflow_names_a_workflow_never_a_file(server: Server, disk: Disk) -> None:
    """A registered definition whose subflow's `workflow:` is a file's name, started by an
    operator: its child is looked for by name and fails to start; no file is read."""
    for child in (f"{MODULE}.py", "probe.yaml", "probe.json"):
        parent = {
            "name": "parent",
            "version": child,
            "steps": [{"id": "sub", "type": "subflow", "workflow": child}],
        }
        await server.rt.register(parent)
        started = await server.operator.post("/runs", json={"workflow": "parent", "version": child})
        assert started.status_code == 201, started.text
        result = await server.rt.wait(started.json()["run_id"], timeout=30)
        assert result.status == "failed"
        error = result.steps["sub"].error
        assert error is not None and f"no definition {child!r} is registered" in str(error)
    untouched(disk)
    names = {d.name for d in await server.rt.client.definitions()}
    assert names == {"hello", "parent"}


async def test_the_definitions_directory_is_found_by_a_plain_name_only(
    store_url: str, disk: Disk, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's own definitions directory answers a start by a plain name, its files
    compiled off the event loop; a name with a file's suffix does not reach it."""
    compiled_on: list[int] = []
    add = DefinitionSource._add

    def recorded(source: DefinitionSource, index: dict[Any, Any], path: Path) -> None:
        compiled_on.append(threading.get_ident())
        add(source, index, path)

    monkeypatch.setattr(DefinitionSource, "_add", recorded)
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "greet.yaml").write_text(json.dumps({**HELLO, "name": "greet"}))
    async with Runtime(store=store_url, workers=1, definitions_dir=flows) as rt:
        token = await issue_token(rt.client.store, name="ops", role=Role.OPERATOR, now=0.0)
        headers = {"authorization": f"Bearer {token.value}"}
        transport = httpx.ASGITransport(app=create_app(rt.client))
        async with httpx.AsyncClient(
            transport=transport, base_url="http://api", headers=headers
        ) as api:
            assert (await api.post("/runs", json={"workflow": "greet.yaml"})).status_code == 404
            started = await api.post("/runs", json={"workflow": "greet"})
            assert started.status_code == 201, started.text
        assert (await rt.wait(started.json()["run_id"], timeout=30)).status == "succeeded"
        assert [d.name for d in await rt.client.definitions()] == ["greet"]
    assert compiled_on and threading.get_ident() not in compiled_on


async def test_a_python_start_still_loads_the_file_the_caller_owns(
    store_url: str, disk: Disk
) -> None:
    """The Python API (the person at the keyboard) keeps starting a file."""
    async with Runtime(store=store_url, workers=1) as rt:
        run_id = await rt.start_run("probe.json")
        assert (await rt.wait(run_id, timeout=30)).status == "succeeded"
