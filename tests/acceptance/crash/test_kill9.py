"""Kill -9: real processes driving real workflows are SIGKILLed at many points and restarted.

For each backend (SQLite, PostgreSQL in a fresh schema) a series of *scenarios*
runs, each on a fresh store: the driver (``driver.py``, the embedded runtime in a
subprocess) starts the runs of `crash_workflows`, is killed, is restarted
(resuming the runs, starting the ones not yet created) and maybe killed again,
until a last uninterrupted driver sees every run end. Kills are either
deterministic (``TIDEFLOW_FAULT=<point>:<n>``: the runtime SIGKILLs itself the
n-th time it reaches that point) or a ``proc.kill()`` after a random delay. The
RNG is seeded (printed; set ``TIDEFLOW_CRASH_SEED`` to replay a seed's plan; the
timing of random kills still varies). ``TIDEFLOW_CRASH_KILLS=500`` makes a soak.

After every kill the test reads the store and the step functions' execution log
and checks, for every step instance (a run's step key, or its compensation):

- no execution started after a kill for an attempt whose outcome was committed
  before it (a committed step never runs again);
- between two kills, executions = outcomes committed + at most one per step
  instance interrupted by that kill (none when the driver was not killed);
- no attempt ran twice in one process, and every execution carried the
  instance's idempotency key.

At the end: every run exists and ended with its expected status and output
(zero lost runs), nothing is left unfinished and the last driver finished in
time (zero stuck runs), at most one committed completion per step instance and
one committed outcome per attempt (zero duplicated committed completions), and
the kills covered every situation the issue names.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "driver.py"
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import crash_workflows as wf  # noqa: E402
from crash_checks import ENDED, Execution, Instance, StoreView, observe, read_log  # noqa: E402

from tideflow.store import Store, open_store  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

SEED = int(os.environ.get("TIDEFLOW_CRASH_SEED") or random.SystemRandom().randrange(2**32))

COPIES = 2
"""Runs of each workflow per scenario (10 runs in all)."""
MIN_KILLS = max(50, int(os.environ.get("TIDEFLOW_CRASH_KILLS") or 0))
"""Kill points per backend: at least the issue's 50 (more for a soak)."""
FAULT_REACHED = {
    "before_commit": 50,
    "after_commit": 50,
    "after_relay": 50,
    "task_started": 38,
    "task_finished": 34,
}
"""How often one uninterrupted driver reaches each fault point (measured), so that the
deterministic kills are spread over the whole life of the runs."""
FAULTS_PER_POINT = 4
EXTRA_SCENARIOS = MIN_KILLS
"""Random scenarios added at most when the planned ones fell short of kills or situations."""
DRIVER_TIMEOUT = 60.0
"""An uninterrupted driver must see every run end within this (the runs take ~1 s)."""

SITUATIONS = (
    "after_dispatch",
    "mid_step",
    "completed_not_committed",
    "compensating",
    "timer_wait",
    "signal_wait",
)
"""Where a kill must have landed at least once per backend (the issue's list)."""


# --- stores ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Backend:
    name: str
    url: str
    schema: str | None = None

    def driver_args(self) -> list[str]:
        return ["--store", self.url, *(["--schema", self.schema] if self.schema else [])]

    def store(self, *, drop: bool = False) -> Store:
        if self.schema is None:
            return open_store(self.url)
        from tideflow.store.backends.postgres import PostgresStore

        return PostgresStore(self.url, schema=self.schema, drop_schema_on_close=drop)

    async def settled(self, pid: int) -> None:
        """Once the killed driver ``pid`` is gone, wait until its database sessions are too:
        a COMMIT it sent just before the kill still lands after it died, and the next
        driver's segment would count it (PostgreSQL; an SQLite write ends with its process)."""
        if self.schema is None:
            return
        import asyncpg  # type: ignore[import-untyped]

        mine = f"tideflow/{pid}/%"
        conn = await asyncpg.connect(self.url)
        try:
            deadline = time.monotonic() + 20
            query = "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1"
            while await conn.fetchval(query, mine):
                assert time.monotonic() < deadline, f"driver {pid}'s sessions outlived it 20s"
                await asyncio.sleep(0.01)
        finally:
            await conn.close()

    @contextlib.asynccontextmanager
    async def opened(self, *, drop: bool = False) -> AsyncIterator[Store]:
        store = self.store(drop=drop)
        await store.open()
        try:
            yield store
        finally:
            await store.close()


class BackendFactory:
    """A fresh store per scenario: a new SQLite file, or a new PostgreSQL schema."""

    def __init__(self, kind: str, root: Path, postgres_url: str | None) -> None:
        self.kind = kind
        self._root = root
        self._postgres_url = postgres_url
        self.made: list[Backend] = []

    def new(self, name: str) -> Backend:
        if self.kind == "sqlite":
            backend = Backend(name, f"sqlite:///{self._root / name / 'store.db'}")
        else:
            assert self._postgres_url is not None
            schema = f"crash_{uuid.uuid4().hex[:12]}"
            backend = Backend(name, self._postgres_url, schema)
        self.made.append(backend)
        return backend

    async def drop_all(self) -> None:
        if self.kind != "postgres":
            return
        for backend in self.made:
            async with backend.opened(drop=True):
                pass


@pytest.fixture(params=["sqlite", "postgres"])
async def backends(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BackendFactory]:
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    factory = BackendFactory(request.param, tmp_path, url)
    yield factory
    await factory.drop_all()


# --- what a scenario does -------------------------------------------------------------


@dataclass(frozen=True)
class Kill:
    """How one driver process dies: at a fault point, or SIGKILLed after a delay."""

    fault: str | None = None
    """``<point>:<n>`` for ``TIDEFLOW_FAULT``."""
    delay: float = 0.0
    after_ready: bool = True
    """Count ``delay`` from the driver's ready line (else from its launch)."""

    def __str__(self) -> str:
        if self.fault:
            return f"fault {self.fault}"
        return f"kill {self.delay:.3f}s after {'ready' if self.after_ready else 'launch'}"


def random_kill(rng: random.Random) -> Kill:
    if rng.random() < 0.25:  # during start-up: store open, recovery, run creation
        return Kill(delay=rng.uniform(0.25, 0.6), after_ready=False)
    return Kill(delay=rng.uniform(0.0, 0.3))  # the runs take ~0.3-0.5 s after ready


def planned_scenarios(rng: random.Random) -> list[list[Kill]]:
    """Per fault point, ``FAULTS_PER_POINT`` scenarios whose first kill is that point at
    an n spread over the runs' whole life; then a fault at another point (counted in
    the resumed process) and a random kill."""
    points = list(FAULT_REACHED)
    scenarios = []
    for p, point in enumerate(points):
        reached = FAULT_REACHED[point]
        for j in range(FAULTS_PER_POINT):
            low, high = 1 + j * reached // FAULTS_PER_POINT, (j + 1) * reached // FAULTS_PER_POINT
            second = points[(p + j + 1) % len(points)]
            scenarios.append(
                [
                    Kill(fault=f"{point}:{rng.randint(low, high)}"),
                    Kill(fault=f"{second}:{rng.randint(1, 12)}"),
                    random_kill(rng),
                ]
            )
    rng.shuffle(scenarios)
    return scenarios


# --- running the driver -------------------------------------------------------------------


@dataclass
class DriverExit:
    pid: int
    returncode: int
    ready: bool
    messages: list[dict[str, Any]]
    stderr: str

    @property
    def killed(self) -> bool:
        return self.returncode == -9

    def message(self, event: str) -> dict[str, Any] | None:
        return next((m for m in self.messages if m.get("event") == event), None)


async def run_driver(
    backend: Backend, log: Path, mode: str, kill: Kill | None, rng: random.Random
) -> DriverExit:
    env = {k: v for k, v in os.environ.items() if k != "TIDEFLOW_FAULT"}
    if kill is not None and kill.fault:
        env["TIDEFLOW_FAULT"] = kill.fault
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(DRIVER),
        *backend.driver_args(),
        "--log",
        str(log),
        "--copies",
        str(COPIES),
        "--mode",
        mode,
        "--seed",
        str(rng.randrange(2**32)),
        "--timeout",
        str(DRIVER_TIMEOUT - 10),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=log.parent,
    )
    assert proc.stdout is not None and proc.stderr is not None
    ready = asyncio.Event()
    messages: list[dict[str, Any]] = []

    async def read_stdout() -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            message = json.loads(raw)
            messages.append(message)
            if message.get("event") == "ready":
                ready.set()

    async def killer() -> None:
        assert kill is not None
        if kill.after_ready:
            await ready.wait()
        await asyncio.sleep(kill.delay)
        sigkill(proc)

    reader = asyncio.create_task(read_stdout())
    errors = asyncio.create_task(proc.stderr.read())
    timer = asyncio.create_task(killer()) if kill is not None and not kill.fault else None
    try:
        await asyncio.wait_for(proc.wait(), DRIVER_TIMEOUT)
    except TimeoutError:
        sigkill(proc)
        await proc.wait()
        raise AssertionError(
            f"the driver (pid {proc.pid}) was stuck for {DRIVER_TIMEOUT}s"
        ) from None
    finally:
        if timer is not None:
            timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await timer
        await reader
        stderr = (await errors).decode(errors="replace")
    assert proc.returncode is not None
    return DriverExit(proc.pid, proc.returncode, ready.is_set(), messages, stderr)


def sigkill(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the driver unless it has been reaped. Not ``proc.kill()``: that polls the
    child first, and a child that has just exited is then reaped by the poll, so asyncio's
    child watcher finds no status and reports 255 instead of its real exit code."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)


# --- one scenario -----------------------------------------------------------------------


@dataclass
class Tally:
    kills: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    situations: Counter[str] = field(default_factory=Counter)
    processes: int = 0


class Scenario:
    def __init__(self, backend: Backend, root: Path, rng: random.Random, tally: Tally) -> None:
        self.backend = backend
        self.rng = rng
        self.tally = tally
        self.planned = wf.planned_runs(COPIES)
        self.run_ids = [run.run_id for run in self.planned]
        self.dir = root / backend.name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log = self.dir / "executions.jsonl"
        self.offset = 0
        self.view = StoreView()
        self.all_executions: list[Execution] = []
        self.story: list[str] = []

    def fail(self, message: str) -> NoReturn:
        pytest.fail(
            f"seed {SEED}, scenario {self.backend.name} ({'; '.join(self.story)}): {message}",
            pytrace=False,
        )

    async def play(self, kills: list[Kill]) -> None:
        for kill in kills:
            exit = await self.segment(kill)
            if not exit.killed:
                break  # the runs ended before this kill could land
            if self.all_ended():
                exit = await self.segment(None)  # a restart finds nothing to redo
                break
        else:
            exit = await self.segment(None)
        self.check_finished(exit)
        await self.check_final()

    def all_ended(self) -> bool:
        statuses = self.view.statuses
        return len(statuses) == len(self.planned) and all(s in ENDED for s in statuses.values())

    async def segment(self, kill: Kill | None) -> DriverExit:
        mode = "resume" if len(self.view.statuses) == len(self.planned) else "start"
        exit = await run_driver(self.backend, self.log, mode, kill, self.rng)
        self.tally.processes += 1
        self.story.append(f"{mode} {kill or 'no kill'} -> rc {exit.returncode}")
        stuck = exit.message("timeout")
        if stuck is not None:
            self.fail(f"runs stuck: {stuck['unfinished']} did not end in {DRIVER_TIMEOUT - 10}s")
        if exit.returncode not in (0, -9):
            self.fail(f"the driver failed (rc {exit.returncode}):\n{exit.stderr}")
        if exit.killed:
            await self.backend.settled(exit.pid)
        async with self.backend.opened() as store:
            previous, self.view = self.view, await observe(store, self.run_ids)
        executions, self.offset = read_log(self.log, self.offset)
        self.all_executions += executions
        self.check_segment(previous, executions, exit.killed)
        if exit.killed:
            self.tally.kills += 1
            self.tally.by_kind["fault" if kill and kill.fault else "random"] += 1
            for situation in self.situations(executions, exit):
                self.tally.situations[situation] += 1
        return exit

    def check_segment(self, before: StoreView, executions: list[Execution], killed: bool) -> None:
        """Check what one driver process executed against what the store committed."""
        starts: Counter[Instance] = Counter()
        attempts: Counter[tuple[Instance, int]] = Counter()
        for ex in executions:
            if ex.idempotency_key != ex.expected_key:
                self.fail(f"{ex} ran with idempotency key {ex.idempotency_key!r}")
            if ex.phase != "start":
                continue
            starts[ex.instance] += 1
            attempts[(ex.instance, ex.attempt)] += 1
            if attempts[(ex.instance, ex.attempt)] > 1:
                self.fail(f"step {ex.instance} attempt {ex.attempt} ran twice in pid {ex.pid}")
            if before.completions[ex.instance] or before.outcomes[(ex.instance, ex.attempt)]:
                self.fail(
                    f"step {ex.instance} attempt {ex.attempt} ran again in pid {ex.pid} "
                    "although its outcome was committed before that process started"
                )
        instances = set(starts) | {inst for inst, _ in self.view.outcomes}
        for inst in instances:
            extra = starts[inst] - (self.view.committed(inst) - before.committed(inst))
            allowed = 1 if killed else 0
            if not 0 <= extra <= allowed:
                self.fail(
                    f"step {inst}: {starts[inst]} execution(s) in this process, "
                    f"{self.view.committed(inst) - before.committed(inst)} outcome(s) committed; "
                    f"at most {allowed} more execution(s) than committed outcomes allowed"
                )

    def situations(self, executions: list[Execution], exit: DriverExit) -> set[str]:
        """Where the kill landed, from the store and the log at the time of the kill."""
        found: set[str] = set() if exit.ready else {"starting"}
        view = self.view
        started = {(ex.instance, ex.attempt) for ex in executions if ex.phase == "start"}
        ended = {(ex.instance, ex.attempt) for ex in executions if ex.phase == "end"}
        started_steps = {inst[:2] for inst, _ in started}
        if started - ended:
            found.add("mid_step")
        if any(not view.outcomes[item] for item in ended):
            found.add("completed_not_committed")
        for (run_id, subject), status in view.latest.items():
            if view.statuses.get(run_id) in ENDED:
                continue
            step = subject.removesuffix(":compensate")
            action = step not in ("run", "fan")  # `fan` is the map, running while its items do
            if status == "running" and action and (run_id, step) not in started_steps:
                found.add("after_dispatch")
            if status == "waiting" and subject == "nap":
                found.add("timer_wait")
            if status == "waiting" and subject == "go":
                found.add("signal_wait")
        if "compensating" in view.statuses.values():
            found.add("compensating")
        return found

    def check_finished(self, exit: DriverExit) -> None:
        finished = exit.message("finished")
        if exit.returncode != 0 or finished is None:
            self.fail(f"the last driver did not finish the runs: {exit.messages}\n{exit.stderr}")
        for reported in finished["runs"]:
            run = next(r for r in self.planned if r.run_id == reported["run_id"])
            if (reported["status"], reported["output"]) != (run.status, run.output):
                self.fail(f"the driver reported {reported} for {run}")

    async def check_final(self) -> None:
        view = self.view
        for run in self.planned:
            if run.run_id not in view.statuses:
                self.fail(f"run {run.run_id} was lost (not in the store)")
            got = (view.statuses[run.run_id], view.outputs[run.run_id])
            if got != (run.status, run.output):
                self.fail(f"run {run.run_id} ended {got}, expected {(run.status, run.output)}")
            for key in run.compensated:
                if view.completions[(run.run_id, key, True)] != 1:
                    self.fail(f"run {run.run_id}: the compensation of {key} did not complete once")
        async with self.backend.opened() as store:
            unfinished = await store.unfinished_runs()
        if unfinished:
            self.fail(f"runs left unfinished: {unfinished}")
        if view.damage:
            self.fail(f"damaged histories: {view.damage}")
        for inst, count in view.completions.items():
            if count > 1:
                self.fail(f"step {inst} has {count} committed completions")
        for (inst, attempt), count in view.outcomes.items():
            if count > 1:
                self.fail(f"step {inst} attempt {attempt} has {count} committed outcomes")
        self.check_attempts()

    def check_attempts(self) -> None:
        """Committed attempts of an instance are 1..n, and every execution was one of them
        (a re-dispatch after a crash keeps its attempt number)."""
        attempts: dict[Instance, set[int]] = {}
        for inst, attempt in self.view.outcomes:
            attempts.setdefault(inst, set()).add(attempt)
        for inst, numbers in attempts.items():
            if numbers != set(range(1, len(numbers) + 1)):
                self.fail(f"step {inst} has committed attempts {sorted(numbers)}")
        for ex in self.all_executions:
            if ex.attempt not in attempts.get(ex.instance, ()):
                self.fail(f"{ex} ran an attempt that never got a committed outcome")


# --- the test -------------------------------------------------------------------------


async def test_kill9_at_many_points_loses_nothing(
    backends: BackendFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(f"{SEED}:{backends.kind}")
    print(f"kill -9 test on {backends.kind}: seed {SEED} (TIDEFLOW_CRASH_SEED={SEED} to replay)")
    tally = Tally()
    started = time.monotonic()
    scenarios = planned_scenarios(rng)
    for index, kills in enumerate(scenarios):
        await Scenario(backends.new(f"s{index:02d}"), tmp_path, rng, tally).play(kills)
    extra = 0
    while (tally.kills < MIN_KILLS or _missing(tally)) and extra < EXTRA_SCENARIOS:
        kills = [random_kill(rng) for _ in range(3)]
        await Scenario(backends.new(f"x{extra:02d}"), tmp_path, rng, tally).play(kills)
        extra += 1
    summary = (
        f"{backends.kind}: {tally.kills} kills ({dict(tally.by_kind)}) in "
        f"{len(scenarios) + extra} scenarios, {tally.processes} driver processes, "
        f"{time.monotonic() - started:.1f}s; situations {dict(tally.situations)}; seed {SEED}"
    )
    with capsys.disabled():
        print(f"\n{summary}")
    assert tally.kills >= MIN_KILLS, summary
    assert not _missing(tally), f"no kill landed in {_missing(tally)}: {summary}"


def _missing(tally: Tally) -> list[str]:
    return [s for s in SITUATIONS if not tally.situations[s]]
