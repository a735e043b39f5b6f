"""Redis Sentinel on loopback: one master, its replicas and three sentinels.

``RedisSentinel`` starts ``redis-server`` processes on free ports in a directory of the
caller's: a master, ``replicas`` replicas of it (2 by default: after a failover one
replica is still left, so ``WAIT 1`` keeps working) and three sentinels (quorum 2)
monitoring it under ``master_name``, with a short ``down-after-milliseconds`` (1 s) and
``failover-timeout`` (2 s), so that a killed master is replaced within a few seconds.
``url`` is the ``redis+sentinel://`` bus URL of the topology.

Faults: ``kill(node)`` (SIGKILL by default), ``restart(node)`` (a data node comes back
as a replica of the master the sentinels name now, as an operator would bring back a
failed master), ``kill_master()`` and ``wait_failover(old)`` (until the sentinels agree
on a new master and it answers as one). Everything is waited for on a condition, with a
bound. Used as a context manager: on exit every process is SIGKILLed, also after a
failure; the caller's directory (a pytest ``tmp_path``) holds the logs.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tideflow.testing.brokers import free_port

REDIS_SERVER = "/usr/bin/redis-server"
MASTER_NAME = "tideflow"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 2000
QUORUM = 2
SENTINELS = 3

T = TypeVar("T")


def binary() -> str | None:
    """``redis-server`` (which also runs a sentinel), or None on a machine without it."""
    return REDIS_SERVER if Path(REDIS_SERVER).exists() else shutil.which("redis-server")


def wait_for(check: Callable[[], T | None], what: str, timeout: float) -> T:
    """``check()``'s first truthy value, looked at every 20 ms for up to ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout:g}s: {what}")
        time.sleep(0.02)


def command(port: int, *args: str | int, timeout: float = 1.0) -> Any:
    """One command to the ``redis-server`` (or sentinel) on ``port``: its decoded reply,
    or None when the node does not answer (down, or refusing the connection)."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    client: Any = redis.Redis(  # execute_command is untyped in redis-py
        host="127.0.0.1",
        port=port,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        decode_responses=True,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        return client.execute_command(*args)
    except (redis.RedisError, OSError):
        return None
    finally:
        client.close()


@dataclass
class Node:
    """One ``redis-server`` process: a data node (``redis-N``) or a sentinel
    (``sentinel-N``), with its port, directory and log."""

    name: str
    data: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def sentinel(self) -> bool:
        return self.name.startswith("sentinel")

    @property
    def log(self) -> Path:
        return self.data / f"{self.name}.log"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, args: list[str]) -> None:
        path = binary()
        if path is None:
            raise FileNotFoundError("no redis-server binary on this machine")
        self.data.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [path, *args], stdout=out, stderr=subprocess.STDOUT, cwd=self.data
            )

        def ready() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n{self.log.read_text(errors='replace')}")
            return _pong(self.port)

        wait_for(ready, f"{self.name} answers on port {self.port}", 20.0)

    def stop(self, sig: signal.Signals = signal.SIGKILL) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(sig)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(20)


class RedisSentinel:
    """A master, ``replicas`` replicas and three sentinels in ``data`` (see the module)."""

    def __init__(self, data: Path, *, replicas: int = 2, master_name: str = MASTER_NAME) -> None:
        if replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {replicas}")
        self.data = data
        self.master_name = master_name
        self.nodes: dict[str, Node] = {
            f"redis-{i}": Node(f"redis-{i}", data / f"redis-{i}") for i in range(replicas + 1)
        }
        self.sentinels: dict[str, Node] = {
            f"sentinel-{i}": Node(f"sentinel-{i}", data / f"sentinel-{i}") for i in range(SENTINELS)
        }
        self.first_master = "redis-0"
        self.failovers = 0

    # -- what to give tideflow ----------------------------------------------------

    @property
    def url(self) -> str:
        """The bus URL: every sentinel, then the master's name and the database."""
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.sentinels.values())
        return f"redis+sentinel://{hosts}/{self.master_name}/0"

    def master_url(self) -> str:
        """A plain ``redis://`` URL of the current master (to look at its data)."""
        return f"redis://127.0.0.1:{self.nodes[self.master()].port}/0"

    # -- lifecycle ----------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> None:
        """Start every node and wait until each sentinel knows the master, its replicas
        and the two other sentinels (a failover needs a majority that knows each other)."""
        master = self.nodes[self.first_master]
        master.start(self._data_args(master, None))
        for node in self.nodes.values():
            if node is not master:
                node.start(self._data_args(node, master.port))
        for sentinel in self.sentinels.values():
            self._write_sentinel_conf(sentinel, master.port)
            sentinel.start([str(sentinel.data / "sentinel.conf"), "--sentinel"])
        self.wait_healthy(timeout)

    def stop(self) -> None:
        """SIGKILL every process (the data directory stays for the logs)."""
        for node in [*self.sentinels.values(), *self.nodes.values()]:
            with contextlib.suppress(Exception):
                node.stop(signal.SIGKILL)

    def __enter__(self) -> RedisSentinel:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- faults -------------------------------------------------------------------

    def node(self, name: str) -> Node:
        found = self.nodes.get(name) or self.sentinels.get(name)
        if found is None:
            raise KeyError(f"no node {name!r}: {sorted([*self.nodes, *self.sentinels])}")
        return found

    def kill(self, name: str, sig: signal.Signals = signal.SIGKILL) -> None:
        """Stop node ``name`` with ``sig`` (SIGKILL: a crash)."""
        self.node(name).stop(sig)

    def restart(self, name: str) -> None:
        """Start node ``name`` again on its port and directory. A data node comes back as
        a replica of the master the sentinels name now (never as a second master); a
        sentinel comes back with the configuration it rewrote while it ran."""
        node = self.node(name)
        node.stop(signal.SIGKILL)
        if node.sentinel:
            node.start([str(node.data / "sentinel.conf"), "--sentinel"])
            return
        master = self.master()
        node.start(self._data_args(node, None if master == name else self.nodes[master].port))

    def kill_master(self, sig: signal.Signals = signal.SIGKILL) -> str:
        """Kill the current master; its name (give it to ``wait_failover``)."""
        name = self.master()
        self.kill(name, sig)
        return name

    def wait_failover(self, old: str, timeout: float = 30.0) -> str:
        """Wait until a majority of the sentinels name a master other than ``old`` and
        that node answers as a master; its name."""

        def promoted() -> str | None:
            named = [self._named_by(s) for s in self.sentinels.values() if s.alive]
            for name in set(named):
                if name is None or name == old or named.count(name) < QUORUM:
                    continue
                role = command(self.nodes[name].port, "ROLE")
                if role and role[0] == "master":
                    return name
            return None

        name = wait_for(promoted, f"the sentinels promote a replica in place of {old}", timeout)
        self.failovers += 1
        return name

    def master(self) -> str:
        """The data node a majority of the live sentinels name as the master now."""
        named = [self._named_by(s) for s in self.sentinels.values() if s.alive]
        for name in set(named):
            if name is not None and named.count(name) >= QUORUM:
                return name
        raise RuntimeError(f"the sentinels do not agree on a master: {named}")

    def replicas_of(self, name: str) -> list[str]:
        """The data nodes replicating from ``name`` now (its ``INFO replication``)."""
        info = command(self.nodes[name].port, "INFO", "replication") or {}
        ports = {
            int(value["port"])
            for key, value in info.items()
            if key.startswith("slave")
            and isinstance(value, dict)
            and value.get("state") == "online"
        }
        return [n for n, node in self.nodes.items() if node.port in ports]

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Wait until every live sentinel sees the master, the other live sentinels and
        the master's live replicas, and those replicas are in sync."""

        def healthy() -> bool:
            master = self.nodes[self._agreed_master()]
            live_data = sum(1 for n in self.nodes.values() if n.alive and n is not master)
            live_sentinels = sum(1 for s in self.sentinels.values() if s.alive)
            for sentinel in self.sentinels.values():
                if not sentinel.alive:
                    continue
                state = command(sentinel.port, "SENTINEL", "MASTER", self.master_name)
                if not state:
                    return False
                if not isinstance(state, dict):  # redis-py parses it into a dict
                    return False
                fields = state
                if (
                    int(fields.get("port", 0)) != master.port
                    or "down" in fields.get("flags", "")
                    or int(fields.get("num-other-sentinels", 0)) < live_sentinels - 1
                    or int(fields.get("num-slaves", 0)) < live_data
                ):
                    return False
            return len(self.replicas_of(master.name)) >= live_data

        wait_for(healthy, "the sentinel topology is healthy", timeout)

    # -- internals ----------------------------------------------------------------

    def _agreed_master(self) -> str:
        try:
            return self.master()
        except RuntimeError:
            return ""

    def _named_by(self, sentinel: Node) -> str | None:
        reply = command(sentinel.port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name)
        if not reply:
            return None
        port = int(reply[1])
        return next((n for n, node in self.nodes.items() if node.port == port), None)

    def _data_args(self, node: Node, master_port: int | None) -> list[str]:
        args = [
            "--port",
            str(node.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(node.data),
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--save",
            "",
            "--repl-diskless-sync",
            "yes",
            "--repl-diskless-sync-delay",
            "0",
        ]
        if master_port is not None:
            args += ["--replicaof", "127.0.0.1", str(master_port)]
        return args

    def _write_sentinel_conf(self, sentinel: Node, master_port: int) -> None:
        sentinel.data.mkdir(parents=True, exist_ok=True)
        name = self.master_name
        (sentinel.data / "sentinel.conf").write_text(
            f"port {sentinel.port}\n"
            "bind 127.0.0.1\n"
            f"dir {sentinel.data}\n"
            f"sentinel monitor {name} 127.0.0.1 {master_port} {QUORUM}\n"
            f"sentinel down-after-milliseconds {name} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {name} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {name} 2\n"
        )


def _pong(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(7).startswith(b"+PONG")
    except OSError:
        return False
