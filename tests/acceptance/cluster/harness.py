"""A cluster of real processes for the tests: `tideflow server` and `tideflow worker`
subprocesses on PostgreSQL (a fresh schema per test) and each bus, Redis Streams and NATS
JetStream (a fresh prefix per test), and `tideflow` CLI calls against them. ``cluster``
uses the machine's shared brokers; ``private_cluster`` a broker of the test's own
(``tideflow.testing.brokers``) that the test may restart or kill. Everything is waited
for on a condition with a bound (``eventually``), never on a sleep."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tideflow.testing.brokers import PrivateBroker

HERE = Path(__file__).resolve().parent
FLOWS = HERE / "flows"
TIDEFLOW = str(Path(sys.executable).with_name("tideflow"))
BUS_LEASE = 2.0
"""Seconds a delivery is held without renewal: how soon a SIGKILLed worker's task, or a
dead server's partitions, come again."""
ENGINE_LEASE_TTL = 2.0


async def partition_holders(store_url: str) -> dict[int, int]:
    """Partition -> pid of the server whose lease on it has not expired."""
    from tideflow.store import open_store

    store = open_store(store_url)
    await store.open()
    try:
        rows = await store.list_leases("partition:")
    finally:
        await store.close()
    now = time.time()
    return {int(r.name.split(":")[1]): r.pid for r in rows if r.expires_at > now}


def eventually(check: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    """``check()``'s first truthy value, looked at every 20 ms for up to ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.02)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_log(self, needle: str, timeout: float = 20.0) -> None:
        def seen() -> bool:
            if needle in self.text():
                return True
            if self.popen.poll() is not None:
                raise AssertionError(f"{self.name} exited {self.popen.returncode}:\n{self.text()}")
            return False

        eventually(seen, f"{self.name} logs {needle!r}\n{self.text()}", timeout)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def kill(self) -> None:
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(10)

    def term(self, timeout: float = 20.0) -> int:
        """SIGTERM, and the exit code; a process that does not stop in time fails with its
        log's end (which says, 10 s after the signal, where each of its tasks waits)."""
        self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.name} (pid {self.pid}) had not stopped {timeout:g}s after SIGTERM; "
                f"its log ends:\n{self.text()[-8000:]}"
            ) from None


@dataclass
class Cluster:
    store: str
    bus: str
    tmp: Path
    env: dict[str, str]
    procs: list[Proc] = field(default_factory=list)
    broker: PrivateBroker | None = None
    """The test's own broker (``private_cluster``), None on the shared one."""

    @property
    def steps_log(self) -> Path:
        return Path(self.env["TIDEFLOW_CLUSTER_LOG"])

    def _spawn(self, name: str, args: list[str]) -> Proc:
        log = self.tmp / f"{name}-{len(self.procs)}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [TIDEFLOW, *args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.tmp,
            )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def server(self, *args: str, ready: bool = True) -> Proc:
        proc = self._spawn("server", ["server", *args])
        if ready:
            proc.wait_log("serving:")
        return proc

    def servers(self, count: int, *args: str) -> list[Proc]:
        """``count`` active servers on the store, sharing its partitions."""
        return [self.server(*args) for _ in range(count)]

    def worker(self, *args: str) -> Proc:
        proc = self._spawn("worker", ["worker", "--path", str(HERE), *args])
        proc.wait_log("taking tasks from")
        return proc

    def cli(self, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [TIDEFLOW, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.tmp,
        )

    def start(self, flow: str, input: dict[str, Any]) -> str:
        done = self.cli("runs", "start", str(FLOWS / f"{flow}.yaml"), "--input", json.dumps(input))
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def executions(self) -> list[dict[str, Any]]:
        if not self.steps_log.exists():
            return []
        found = []
        for line in self.steps_log.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:  # empty, a record being written, or torn by SIGKILL
                continue
        return found

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.popen.poll() is None:
                proc.popen.kill()
                proc.popen.wait(10)


async def _drop(postgres_url: str, schema: str, kind: str, bus_url: str, prefix: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(postgres_url)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()
    if kind == "nats":
        from tideflow.bus.backends.nats import NatsBus
        from tideflow.testing.nats import delete_prefix

        bus = NatsBus(bus_url, prefix=prefix)
        await bus.open()
        try:
            await delete_prefix(bus)
        finally:
            await bus.close()
        return
    import redis.asyncio as aioredis

    client = aioredis.from_url(bus_url)
    try:
        keys = [key async for key in client.scan_iter(match=f"{prefix}:*", count=1000)]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


@contextlib.contextmanager
def _cluster(
    postgres_url: str, kind: str, bus_url: str, tmp_path: Path, broker: PrivateBroker | None
) -> Iterator[Cluster]:
    token = uuid.uuid4().hex[:12]
    schema, prefix = f"cluster_{token}", f"cluster-{token}"
    store = f"{postgres_url}{'&' if '?' in postgres_url else '?'}schema={schema}"
    bus = f"{bus_url}?prefix={prefix}&lease={BUS_LEASE:g}"
    env = {
        **os.environ,
        "TIDEFLOW_STORE": store,
        "TIDEFLOW_BUS": bus,
        "TIDEFLOW_ENGINE_LEASE_TTL": f"{ENGINE_LEASE_TTL:g}",
        "TIDEFLOW_CLUSTER_LOG": str(tmp_path / "steps.jsonl"),
        "COLUMNS": "200",
    }
    env.pop("TIDEFLOW_FAULT", None)
    running = Cluster(store=store, bus=bus, tmp=tmp_path, env=env, broker=broker)
    try:
        yield running
    finally:
        running.stop_all()
        if broker is not None and broker.process is None:
            broker.start()  # a test that failed with its broker down: clean up after it
        asyncio.run(_drop(postgres_url, schema, kind, bus_url, prefix))


@pytest.fixture(params=["redis", "nats"])
def cluster(postgres_url: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    """A cluster on PostgreSQL and each bus (Redis Streams, NATS JetStream)."""
    kind = str(request.param)
    bus_url = str(request.getfixturevalue(f"{kind}_url"))
    with _cluster(postgres_url, kind, bus_url, tmp_path, None) as running:
        yield running


@pytest.fixture(params=["redis", "nats"])
def private_cluster(
    postgres_url: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Cluster]:
    """A cluster on PostgreSQL and a broker of the test's own (``cluster.broker``), which
    the test may restart or kill: Redis with an fsynced append-only file, NATS with
    JetStream file storage."""
    kind = str(request.param)
    request.getfixturevalue("broker_binary")(kind)
    with (
        PrivateBroker(kind, tmp_path / "broker") as broker,
        _cluster(postgres_url, kind, broker.url, tmp_path, broker) as running,
    ):
        yield running
