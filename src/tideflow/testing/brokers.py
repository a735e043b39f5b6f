"""A private broker a test can restart: ``redis-server`` or ``nats-server`` on a free port
with its data in a directory of the test's, restarted in place (same port, same data).

The shared Redis and NATS of a machine must never be restarted (others use them, and the
system Redis keeps nothing on disk); a test of what happens when the broker goes away
starts its own. Redis runs with an append-only file fsynced on every write
(``appendfsync always``) and no RDB snapshots, NATS with JetStream file storage, so a
restart, even after SIGKILL, keeps everything the broker acknowledged.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

REDIS_SERVER = "/usr/bin/redis-server"
NATS_SERVER = "/usr/sbin/nats-server"
KINDS = ("redis", "nats")


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def binary(kind: str) -> str | None:
    """The server binary for ``kind``, or None when this machine has none."""
    path = REDIS_SERVER if kind == "redis" else NATS_SERVER
    return path if Path(path).exists() else shutil.which(Path(path).name)


@dataclass
class PrivateBroker:
    """One ``redis-server`` or ``nats-server`` process of a test's own."""

    kind: str
    data: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        self.data.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        scheme = "redis" if self.kind == "redis" else "nats"
        suffix = "/0" if self.kind == "redis" else ""
        return f"{scheme}://127.0.0.1:{self.port}{suffix}"

    @property
    def log(self) -> Path:
        return self.data / f"{self.kind}-server.log"

    def command(self) -> list[str]:
        path = binary(self.kind)
        if path is None:
            raise FileNotFoundError(f"no {self.kind}-server binary on this machine")
        if self.kind == "redis":
            return [
                path,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--dir",
                str(self.data),
                "--save",
                "",
            ]
        return [path, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.data)]

    def start(self, timeout: float = 20.0) -> None:
        """Start the server and wait until it answers on its port."""
        if self.process is not None and self.process.poll() is None:
            return
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.command(), stdout=out, stderr=subprocess.STDOUT, cwd=self.data
            )
        deadline = time.monotonic() + timeout
        while not self._ready():
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.kind}-server exited:\n{self.log.read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.kind}-server not ready in {timeout}s")
            time.sleep(0.02)

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 20.0) -> None:
        """Stop the server with ``sig`` (SIGTERM: a clean shutdown; SIGKILL: a crash)."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(sig)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)

    def restart(self, sig: signal.Signals = signal.SIGTERM, down: float = 0.0) -> None:
        """Stop with ``sig``, stay down for ``down`` seconds, start again in place."""
        self.stop(sig)
        if down > 0:
            time.sleep(down)  # the outage itself is what a restart test is about
        self.start()
        self.restarts += 1

    def _ready(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                if self.kind == "nats":
                    return sock.recv(4).startswith(b"INFO")
                sock.sendall(b"PING\r\n")
                return sock.recv(7).startswith(b"+PONG")
        except OSError:
            return False

    def __enter__(self) -> PrivateBroker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.stop(signal.SIGKILL)
