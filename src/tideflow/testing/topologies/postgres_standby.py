"""A PostgreSQL primary and a streaming standby of a test's own, on free loopback ports.

The primary is made with ``initdb`` (``wal_level=replica``, trust for 127.0.0.1 and
for replication in ``pg_hba.conf``), the standby with ``pg_basebackup -R`` from it, and
both are started with ``pg_ctl``. ``url`` names both hosts with
``target_session_attrs=read-write``, the form a production store URL takes
(docs/deployment.md, "PostgreSQL failover"): a client connects to whichever node is the
primary now. A test kills the primary (``kill_primary``: SIGKILL to the postmaster and
every process of its, as when its machine dies), promotes the standby (``promote``) and
waits for the new primary (``wait_primary``); ``restart(node)`` brings a killed node
back, as a standby of the primary of the moment if another node was promoted meanwhile
(it is rebuilt with ``pg_basebackup``: an old primary started as it was would be a second
primary).

``synchronous=True`` makes the primary wait, before it acknowledges a commit, until the
standby has it (``synchronous_standby_names = '*'``): nothing acknowledged is lost in a
failover. Without it replication is asynchronous, as PostgreSQL's default, and a commit
acknowledged by the old primary just before it died can be missing on the new one.

PostgreSQL refuses to run as root: run as root (as on the CI machines), the servers run
as the ``postgres`` user (``runuser -u postgres --``) in a directory of theirs under the
system's temporary directory (a pytest ``tmp_path`` is private to root). ``fsync`` is
off: a killed process loses nothing the kernel has (its page cache outlives it), and
the tests stay fast; a power cut is not what these topologies are about.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tideflow.testing.brokers import free_port

BIN = Path("/usr/lib/postgresql/15/bin")
"""Where Debian puts PostgreSQL 15's server programs (not on PATH)."""
OWNER = "postgres"
"""The user the servers run as when this process is root."""
USER = "postgres"
DATABASE = "postgres"
PRIMARY, STANDBY = "a", "b"
"""The nodes' names; which of them is the primary changes with ``promote``."""


def binary(name: str) -> str | None:
    """The path of PostgreSQL's ``name`` program (``initdb``, ``pg_ctl``, ...), or None."""
    path = BIN / name
    return str(path) if path.exists() else shutil.which(name)


def available() -> bool:
    """Whether this machine can run the topology: the server programs, and a user to run
    them as when this process is root."""
    programs = ("initdb", "pg_ctl", "pg_basebackup", "postgres", "psql")
    if not all(binary(p) for p in programs):
        return False
    if os.geteuid() != 0:
        return True
    try:
        pwd.getpwnam(OWNER)
    except KeyError:
        return False
    return shutil.which("runuser") is not None


@dataclass
class Node:
    """One PostgreSQL server: its data directory and port."""

    name: str
    data: Path
    port: int

    @property
    def log(self) -> Path:
        return self.data.parent / f"{self.name}.log"

    @property
    def url(self) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{DATABASE}"

    def postmaster_pid(self) -> int | None:
        """The postmaster's pid from ``postmaster.pid``, None when it has none (stopped)."""
        try:
            first = (self.data / "postmaster.pid").read_text().split("\n", 1)[0]
        except (FileNotFoundError, PermissionError):
            return None
        return int(first) if first.strip().isdigit() else None


class PostgresStandby:
    """A primary and a streaming standby; a context manager that stops and removes both.

    ``nodes`` by name, ``primary`` / ``standby`` the names of the current roles (after
    ``promote`` the old primary is ``former``, down until ``restart``)."""

    def __init__(self, *, synchronous: bool = False, base: Path | None = None) -> None:
        self.synchronous = synchronous
        self.root = Path(tempfile.mkdtemp(prefix="tideflow-pgstandby-", dir=base))
        self.nodes = {
            name: Node(name, self.root / name, free_port()) for name in (PRIMARY, STANDBY)
        }
        self.primary: str = PRIMARY
        self.standby: str | None = STANDBY
        self.former: str | None = None
        """The node that was primary before the last ``promote``: it must not come back
        as it was (``restart`` rebuilds it as a standby)."""
        self._as_root = os.geteuid() == 0

    # -- URLs -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Both nodes, the one to use chosen by whether it accepts writes: the store URL."""
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes.values())
        return f"postgresql://{USER}@{hosts}/{DATABASE}?target_session_attrs=read-write"

    def node_url(self, name: str) -> str:
        """One node alone (for a test's own checks)."""
        return self.nodes[name].url

    # -- life cycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Make and start the primary, then the standby from a base backup of it, and
        wait until the standby streams (and, ``synchronous``, is the synchronous one)."""
        if self._as_root:
            shutil.chown(self.root, OWNER, OWNER)
        primary = self.nodes[PRIMARY]
        self._run(
            [
                _need("initdb"),
                "-D",
                str(primary.data),
                "-U",
                USER,
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
            ]
        )
        with (primary.data / "postgresql.conf").open("a") as conf:
            conf.write(
                "\n# tideflow.testing.topologies.postgres_standby\n"
                "listen_addresses = '127.0.0.1'\n"
                "wal_level = replica\n"
                "max_wal_senders = 5\n"
                "wal_keep_size = '256MB'\n"
                "hot_standby = on\n"
                "fsync = off\n"
                "shared_buffers = '32MB'\n"
                "max_connections = 100\n"
            )
        (primary.data / "pg_hba.conf").write_text(
            "local all all trust\n"
            "host all all 127.0.0.1/32 trust\n"
            "host replication all 127.0.0.1/32 trust\n"
        )
        self._start(primary)
        self._base_backup(STANDBY, PRIMARY)
        self._start(self.nodes[STANDBY])
        self._wait_streaming()
        if self.synchronous:
            self._make_synchronous()

    def stop(self) -> None:
        """Stop both servers (immediately: nothing of theirs is kept) and remove the
        directory, and the shared memory a killed node left behind."""
        for node in self.nodes.values():
            pid = node.postmaster_pid()
            if _alive(pid):
                with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                    self._run([_need("pg_ctl"), "stop", "-D", str(node.data), "-m", "immediate"])
            self._kill(node)
            _remove_shared_memory(node)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresStandby:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- faults -------------------------------------------------------------------------

    def kill(self, name: str) -> None:
        """SIGKILL the node's postmaster and every process of its, as when its machine
        dies: no backend lingers to answer a client, no shutdown checkpoint is written."""
        self._kill(self.nodes[name])

    def kill_primary(self) -> str:
        """Kill the primary; its name."""
        name = self.primary
        self.kill(name)
        return name

    def promote(self, timeout: float = 30.0) -> str:
        """Promote the standby (``pg_ctl promote``, waited for): it is the primary now,
        the old primary ``former``. The new primary's name."""
        if self.standby is None:
            raise RuntimeError("no standby to promote")
        node = self.nodes[self.standby]
        self._run([_need("pg_ctl"), "promote", "-D", str(node.data), "-w", "-t", f"{timeout:g}"])
        self.former, self.primary, self.standby = self.primary, self.standby, None
        return self.primary

    def failover(self, timeout: float = 30.0) -> str:
        """Kill the primary and promote the standby; the new primary's name."""
        self.kill_primary()
        return self.promote(timeout)

    def restart(self, name: str, timeout: float = 30.0) -> None:
        """Start a killed node again, in place, and wait until the standby streams (when
        both nodes are up). The node that was primary before a promotion comes back as a
        standby of the new primary instead, rebuilt from a base backup (the writes it had
        that the new primary lacks are gone, as in a real failover)."""
        node = self.nodes[name]
        if node.postmaster_pid() is not None and _alive(node.postmaster_pid()):
            return
        if name == self.former:
            _remove_shared_memory(node)
            shutil.rmtree(node.data, ignore_errors=True)
            self._base_backup(name, self.primary)
            self.former, self.standby = None, name
            self._start(node)
            self._wait_streaming(timeout)
            if self.synchronous:
                self._make_synchronous()
            return
        self._start(node)
        if self.standby is not None and _alive(self.nodes[self.primary].postmaster_pid()):
            self._wait_streaming(timeout)  # synchronous: commits wait for it until then

    def wait_primary(self, url: str | None = None, timeout: float = 30.0) -> None:
        """Wait until ``url`` (default: ``url``, both nodes) reaches a server that
        accepts writes."""
        target = url or self.url
        deadline = time.monotonic() + timeout
        while True:
            found = self._psql_url(target, "SELECT pg_is_in_recovery()")
            if found == "f":
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"no primary at {target} within {timeout:g}s")
            time.sleep(0.05)

    def sql(self, name: str, statement: str) -> str:
        """Run one statement on one node with psql; its output (unaligned, no header)."""
        found = self._psql_url(self.nodes[name].url, statement)
        if found is None:
            raise RuntimeError(f"psql on node {name} failed: {statement}")
        return found

    # -- plumbing -----------------------------------------------------------------------

    def _owned(self, command: list[str]) -> list[str]:
        return ["runuser", "-u", OWNER, "--", *command] if self._as_root else command

    def _run(self, command: list[str], timeout: float = 60.0) -> None:
        done = subprocess.run(
            self._owned(command), capture_output=True, text=True, timeout=timeout, cwd=self.root
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
            )

    def _start(self, node: Node) -> None:
        # The Unix socket and its lock file live apart from the data directory, which a
        # base backup copies (a lock file naming a dead postmaster blocks a start), and
        # are made afresh: the node is known to be down.
        pid = node.postmaster_pid()
        if pid is not None and not _alive(pid):
            # Killed: a postmaster no process reaps stays a zombie, which PostgreSQL's
            # lock file check takes for a live server.
            _remove_shared_memory(node)
            (node.data / "postmaster.pid").unlink()
        sockets = self.root / f"{node.name}.sockets"
        shutil.rmtree(sockets, ignore_errors=True)
        sockets.mkdir()
        if self._as_root:
            shutil.chown(sockets, OWNER, OWNER)
        try:
            self._run(
                [
                    _need("pg_ctl"),
                    "start",
                    "-D",
                    str(node.data),
                    "-l",
                    str(node.log),
                    "-w",
                    "-t",
                    "30",
                    "-o",
                    f"-p {node.port} -k {sockets}",
                ]
            )
        except RuntimeError as exc:
            log = node.log.read_text(errors="replace")[-4000:] if node.log.exists() else ""
            raise RuntimeError(f"{exc}\nnode {node.name}'s log ends:\n{log}") from None

    def _base_backup(self, name: str, source: str) -> None:
        node, origin = self.nodes[name], self.nodes[source]
        self._run(
            [
                _need("pg_basebackup"),
                "-h",
                "127.0.0.1",
                "-p",
                str(origin.port),
                "-U",
                USER,
                "-D",
                str(node.data),
                "-R",
                "-X",
                "stream",
                "--no-sync",
                "-c",
                "fast",
            ]
        )
        # The copy has the primary's settings; a standby promoted later must not wait
        # for a synchronous standby of its own (it has none: every commit would hang).
        with (node.data / "postgresql.auto.conf").open("a") as conf:
            conf.write("synchronous_standby_names = ''\n")

    def _wait_streaming(self, timeout: float = 30.0) -> None:
        query = "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"
        deadline = time.monotonic() + timeout
        while self._psql_url(self.nodes[self.primary].url, query) != "1":
            if time.monotonic() > deadline:
                raise TimeoutError(f"the standby does not stream within {timeout:g}s")
            time.sleep(0.05)

    def _make_synchronous(self) -> None:
        name = self.primary
        self.sql(name, "ALTER SYSTEM SET synchronous_standby_names = '*'")
        self.sql(name, "SELECT pg_reload_conf()")
        query = "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'"
        deadline = time.monotonic() + 30
        while self.sql(name, query) != "1":
            if time.monotonic() > deadline:
                raise TimeoutError("the standby did not become synchronous within 30s")
            time.sleep(0.05)

    def _psql_url(self, url: str, statement: str) -> str | None:
        """One statement through psql (libpq takes the multi-host URL as asyncpg does);
        None when it cannot connect or the statement fails."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            done = subprocess.run(
                [_need("psql"), "-X", "-A", "-t", "-q", "-d", url, "-c", statement],
                capture_output=True,
                text=True,
                timeout=10,
                env={**os.environ, "PGCONNECT_TIMEOUT": "2"},
            )
            if done.returncode == 0:
                return done.stdout.strip()
        return None

    def _kill(self, node: Node, timeout: float = 10.0) -> None:
        pid = node.postmaster_pid()
        if pid is None or not _alive(pid):
            return
        victims = [pid, *_children(pid)]
        for victim in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        # A backend forked in the moment before the postmaster died is found now.
        while any(_alive(v) for v in victims) or any(_alive(c) for c in _children_of(victims)):
            for late in _children_of(victims):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(late, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {node.name}'s processes outlived SIGKILL")
            time.sleep(0.02)


def _remove_shared_memory(node: Node) -> None:
    """Remove the System V segment a killed postmaster leaves (line 7 of its
    ``postmaster.pid``: key and id); a postmaster started again in the same directory
    would, but a test's node that stays down would leak it."""
    try:
        lines = (node.data / "postmaster.pid").read_text().splitlines()
    except (FileNotFoundError, PermissionError):
        return
    fields = lines[6].split() if len(lines) > 6 else []
    if len(fields) == 2 and fields[1].isdigit() and shutil.which("ipcrm"):
        subprocess.run(["ipcrm", "-m", fields[1]], capture_output=True, timeout=10, check=False)


def _need(name: str) -> str:
    path = binary(name)
    if path is None:
        raise FileNotFoundError(f"no PostgreSQL program {name!r} on this machine")
    return path


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, None when there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text.rpartition(")")[2].split()
    return fields[0], int(fields[1])


def _alive(pid: int | None) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not reaped by its parent, does not)."""
    if pid is None:
        return False
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def _children(pid: int) -> list[int]:
    return _children_of([pid])


def _children_of(parents: list[int]) -> list[int]:
    """Live processes whose parent is one of ``parents``."""
    wanted = set(parents)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = _stat(int(entry.name))
        if stat is not None and stat[1] in wanted and stat[0] != "Z":
            found.append(int(entry.name))
    return found


__all__ = ["PostgresStandby", "available"]
