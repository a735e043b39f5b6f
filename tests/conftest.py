"""Shared fixtures for the real services the contract and integration tests use.

Each ``*_url`` fixture checks once per session that its server answers. When it
does not, the tests that need it are skipped with how to start it, unless
``TIDEFLOW_REQUIRE_SERVICES`` is set (CI sets it to 1): then they fail, so a
service that went missing in CI can never pass as a skip.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest
import uvloop
from tests.hangs import pytest_timeout_set_timer  # noqa: F401  (a hook: a hang's report)

if TYPE_CHECKING:
    from tideflow.testing.topologies.postgres_standby import PostgresStandby

# The CLI's tables take their width from COLUMNS when stdout is not a terminal (and 200
# without it). Whoever runs the suite (an 80-column shell that exports it, or a
# pytest-xdist worker, which sets 80) must not change what the tests read: a test that
# wants a width passes COLUMNS itself.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)


@dataclass(frozen=True)
class Service:
    name: str
    env: str
    """Environment variable that overrides the default URL."""
    default_url: str
    start: str
    """How to start it on a development machine."""

    @property
    def url(self) -> str:
        return os.environ.get(self.env) or self.default_url


POSTGRES = Service(
    "PostgreSQL",
    "TIDEFLOW_TEST_POSTGRES_URL",
    "postgresql://root@127.0.0.1:5432/test",
    "pg_ctlcluster 15 main start",
)
REDIS = Service(
    "Redis",
    "TIDEFLOW_TEST_REDIS_URL",
    "redis://127.0.0.1:6379/0",
    "redis-server --daemonize yes",
)
NATS = Service(
    "NATS",
    "TIDEFLOW_TEST_NATS_URL",
    "nats://127.0.0.1:4222",
    "nats-server -js &",
)


def services_required() -> bool:
    return os.environ.get("TIDEFLOW_REQUIRE_SERVICES", "").strip() not in ("", "0")


def reachable(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def require(service: Service) -> str:
    """The service's URL, or skip (fail under TIDEFLOW_REQUIRE_SERVICES) when it is down."""
    parts = urlsplit(service.url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 0
    if reachable(host, port):
        return service.url
    message = f"{service.name} not reachable on {host}:{port}: start it with `{service.start}`"
    if services_required():
        pytest.fail(f"{message} (TIDEFLOW_REQUIRE_SERVICES is set: services must run)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def broker_binary() -> Callable[[str], str]:
    """``broker_binary(kind)``: the path of the ``redis-server`` or ``nats-server`` a test
    starts a broker of its own with; skip (fail under TIDEFLOW_REQUIRE_SERVICES) when
    this machine has none."""
    from tideflow.testing.brokers import binary

    def find(kind: str) -> str:
        path = binary(kind)
        if path is not None:
            return path
        message = (
            f"no {kind}-server binary on this machine: install it (Debian: `apt-get install "
            f"{'redis-server' if kind == 'redis' else 'nats-server'}`) to run this test"
        )
        if services_required():
            pytest.fail(f"{message} (TIDEFLOW_REQUIRE_SERVICES is set: services must run)")
        pytest.skip(message)

    return find


@pytest.fixture
def postgres_standby() -> Iterator[PostgresStandby]:
    """A PostgreSQL primary and a synchronous streaming standby of the test's own
    (``tideflow.testing.topologies.postgres_standby``), removed afterwards; skip (fail
    under TIDEFLOW_REQUIRE_SERVICES) when this machine lacks PostgreSQL's programs.
    Synchronous: a commit the old primary acknowledged is on the new one, so a test can
    hold a failover to "nothing acknowledged is lost" without flaking."""
    from tideflow.testing.topologies.postgres_standby import PostgresStandby, available

    if not available():
        message = (
            "no PostgreSQL 15 server programs (initdb, pg_ctl, pg_basebackup) on this "
            "machine: install them (Debian: `apt-get install postgresql-15`) to run this test"
        )
        if services_required():
            pytest.fail(f"{message} (TIDEFLOW_REQUIRE_SERVICES is set: services must run)")
        pytest.skip(message)
    with PostgresStandby(synchronous=True) as topology:
        yield topology


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """A PostgreSQL server URL; give each test its own schema (see the store fixtures)."""
    return require(POSTGRES)


@pytest.fixture(scope="session")
def redis_url() -> str:
    return require(REDIS)


@pytest.fixture(scope="session")
def nats_url() -> str:
    url = require(NATS)
    asyncio.run(_anchor_stream(url))
    return url


ANCHOR_STREAM = "tideflow-tests-anchor"


async def _anchor_stream(url: str) -> None:
    """Keep one small stream on the shared NATS server for as long as tests use it.

    nats-server removes an account's streams directory with its last stream; a stream
    created by another test process in that moment fails with "error creating store for
    stream" (10049: `mkdir .../jetstream/$G/streams: no such file or directory`, seen 9
    times in 6 minutes with three test processes on the server). While this stream
    exists, the directory never empties. Made once per process, idempotently (the same
    configuration again is no change); it holds no message and is never deleted."""
    import nats
    from nats.js.api import StreamConfig

    client = await nats.connect(url)
    try:
        config = StreamConfig(name=ANCHOR_STREAM, subjects=[ANCHOR_STREAM], max_msgs=1)
        await client.jetstream().add_stream(config)
    finally:
        await client.close()


BOTH_LOOPS = (
    "tests/unit/worker",
    "tests/integration/executors",
    "tests/contract/test_bus_contract.py",
    "tests/contract/test_relay_faults.py",
    "tests/unit/runtime/test_runtime.py",
    "tests/unit/runtime/test_containment.py",
)
"""Where the async tests run twice, on asyncio's loop and on uvloop (the loop of every
`tideflow` command, `tideflow.loop`): the engine, its workers and executors (threads,
subprocesses, timeouts), the buses and the relay's faults. Elsewhere: asyncio's loop."""
_ROOT = Path(__file__).resolve().parent.parent
_ASYNCIO_ONLY: Mapping[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop
}
_BOTH: Mapping[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    where = Path(str(item.path)).resolve().relative_to(_ROOT).as_posix()
    if any(where == p or where.startswith(p + "/") for p in BOTH_LOOPS):
        return _BOTH
    return _ASYNCIO_ONLY
