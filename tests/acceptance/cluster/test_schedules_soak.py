"""Schedules on real `tideflow server` processes in real time: every slot starts exactly
one run, within 1 s of its slot while a server is up, and none is fired by the sweep.

Five schedules per server (``every`` 1, 2, 3 and 5 s, and a cron each minute), on SQLite
(an embedded server), PostgreSQL + Redis and PostgreSQL + NATS (one test each: they may
run side by side). Each server is stopped once with SIGTERM and once with SIGKILL and
started again; the slots that fall while no server is up follow the schedules' catch-up
policy (the default, ``latest``: one run for the most recent of them, none for the
others). Lateness is measured from the runs' stored creation times against the slot each
run records (``inputs.scheduled_at``), never from the test's clock; the test's clock only
says which slots fell while a server was up. A wait is on a condition with a bound; the
only waits on time are the downtimes the scenario is made of.

The first test is the reproduction of issue 27: several schedules on one embedded server
with ``--sweep-interval 0`` used to stop firing after a few seconds (a wake-up that came
while a round was finishing was lost, and nothing re-armed).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from harness import TIDEFLOW, Cluster, Proc, eventually  # noqa: E402

from tideflow.store import open_store  # noqa: E402
from tideflow.store.base import RunFilter  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

EVERY = {"s1": 1.0, "s2": 2.0, "s3": 3.0, "s5": 5.0}
CRON = "minute"
ON_TIME = 1.0
"""Seconds a slot's run may start after its slot while a server is up."""
UP = 10.0
"""Seconds each server runs (its every-second schedule fires about that many slots)."""
DOWN = 3.0
"""Seconds no server runs between a stop and the next start."""
SWEEP = 2.0
"""The servers' sweep interval: a lost wake-up would be repaired (and logged) within it."""
SWEEP_FIRED = "the sweep fired"


def definition() -> dict[str, Any]:
    schedules: list[dict[str, Any]] = [
        {"id": sid, "every": every, "overlap": "allow", "input": {"schedule": sid}}
        for sid, every in EVERY.items()
    ]
    schedules.append(
        {"id": CRON, "cron": "* * * * *", "overlap": "allow", "input": {"schedule": CRON}}
    )
    # overlap allow: a run slowed down by a busy machine does not make the next slot skip;
    # catchup is left to its documented default (latest)
    return {
        "name": "ticks",
        "version": "1",
        "schedule": schedules,
        "steps": [{"id": "note", "type": "set", "values": {"at": "{{ inputs.scheduled_at }}"}}],
    }


@dataclass
class Life:
    """One server's life as the test saw it (the test's clock: only to classify slots)."""

    spawned: float
    ready: float
    stopped: float = math.inf


@dataclass
class Soak:
    spawn: Callable[[], Proc]
    store_url: str
    lives: list[Life] = field(default_factory=list)
    procs: list[Proc] = field(default_factory=list)

    def start(self) -> Proc:
        spawned = time.time()
        proc = self.spawn()
        self.lives.append(Life(spawned=spawned, ready=time.time()))
        self.procs.append(proc)
        return proc

    def stop(self, proc: Proc, *, kill: bool) -> None:
        self.lives[-1].stopped = time.time()
        if kill:
            proc.kill()
        else:
            assert proc.term() == 0, proc.text()[-4000:]


def _pass(seconds: float) -> None:
    """Let ``seconds`` of the scenario pass (a downtime or an uptime, not a synchronisation)."""
    end = time.time() + seconds
    eventually(lambda: time.time() >= end, f"{seconds:g}s to pass", timeout=seconds + 5)


async def _read_runs(store_url: str) -> list[tuple[str, float, float]]:
    """(schedule id, slot, created at) of every run of ``ticks``."""
    store = open_store(store_url)
    await store.open()
    try:
        page = await store.list_runs(RunFilter(workflow="ticks"), limit=10_000)
        found = []
        for summary in page.runs:
            state = (await store.load_run(summary.run_id)).snapshot
            slot = datetime.fromisoformat(state.input["scheduled_at"]).timestamp()
            found.append((state.input["schedule"], slot, summary.created_at))
        return found
    finally:
        await store.close()


def _slots(schedule: str, low: float, high: float) -> list[float]:
    """The slots of a schedule in (low, high]."""
    step = 60.0 if schedule == CRON else EVERY[schedule]
    first = math.floor(low / step) * step + step
    return [
        first + k * step for k in range(int((high - first) // step) + 1) if first + k * step <= high
    ]


def check(runs: list[tuple[str, float, float]], lives: list[Life]) -> dict[str, int]:
    """Every slot from the first server's start to the last one's stop has exactly one
    run, on time while a server was up; across each stop and start the slots follow
    ``catchup: latest``. How many runs each schedule has (for the message)."""
    by_schedule: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for schedule, slot, created in runs:
        by_schedule[schedule][slot].append(created)
    problems: list[str] = []
    for schedule in [*EVERY, CRON]:
        made = by_schedule[schedule]
        twice = {slot: times for slot, times in made.items() if len(times) > 1}
        if twice:
            problems.append(f"{schedule}: slots with more than one run: {twice}")
        low, high = lives[0].ready, lives[-1].stopped - ON_TIME
        gaps = [(a.stopped - ON_TIME, b) for a, b in itertools.pairwise(lives)]
        for slot in _slots(schedule, low, high):
            if any(lo < slot <= b.ready + ON_TIME for lo, b in gaps):
                continue  # across a restart: checked below
            created = made.get(slot)
            if not created:
                problems.append(f"{schedule}: slot {slot} (a server was up) has no run")
            elif not 0.0 <= created[0] - slot <= ON_TIME:
                problems.append(f"{schedule}: slot {slot} started {created[0] - slot:.3f}s late")
        for lo, after in gaps:
            problems += _across(schedule, made, _slots(schedule, lo, after.ready + ON_TIME), after)
    assert not problems, "\n".join(problems)
    return {schedule: len(made) for schedule, made in by_schedule.items()}


def _across(
    schedule: str, made: dict[float, list[float]], slots: list[float], after: Life
) -> list[str]:
    """The slots across one stop and start, in order, are: runs the stopped server made
    on time, then the slots no server fired (none, or some), then the run the started
    server made for the latest slot due when it came up (its catch-up: there is one iff
    a slot was missed, or it may be on time), then runs on time."""
    kinds = []
    for slot in slots:
        created = made.get(slot)
        if not created:
            kinds.append("N")
        else:
            kinds.append("R" if created[0] >= after.spawned else "O")
    text = "".join(kinds)
    where = f"{schedule}: slots {slots} across a restart are {text} (O old, N none, R new)"
    if not re.fullmatch(r"O*(N*R)?R*", text):
        return [f"{where}: not what catchup latest does"]
    problems = []
    first_new = text.find("R")
    for i, slot in enumerate(slots):
        created = made.get(slot)
        if not created:
            continue
        late = created[0] - slot
        if i == first_new and late > ON_TIME:  # the catch-up: due when the server came up
            if slot > after.ready:
                problems.append(f"{where}: slot {slot} caught up {late:.3f}s late")
        elif not 0.0 <= late <= ON_TIME:
            problems.append(f"{where}: slot {slot} started {late:.3f}s late")
    return problems


def soak(scenario: Soak) -> dict[str, int]:
    first = scenario.start()
    _pass(UP)
    scenario.stop(first, kill=False)  # gracefully
    _pass(DOWN)
    second = scenario.start()
    _pass(UP)
    scenario.stop(second, kill=True)  # SIGKILL
    _pass(DOWN)
    third = scenario.start()
    _pass(UP)
    scenario.stop(third, kill=False)
    for proc in scenario.procs:
        text = proc.text()
        assert SWEEP_FIRED not in text, text[-4000:]
        assert "Traceback" not in text, text[-4000:]
    return check(asyncio.run(_read_runs(scenario.store_url)), scenario.lives)


# -- SQLite: an embedded server -------------------------------------------------------


def _embedded_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEFLOW_")}
    env["COLUMNS"] = "200"
    return env


def _register(tmp: Path, env: dict[str, str], *store: str) -> None:
    flow = tmp / "ticks.yaml"
    flow.write_text(yaml.safe_dump(definition()))
    done = subprocess.run(
        [TIDEFLOW, "definitions", "register", str(flow), *store],
        env=env, cwd=tmp, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def _embedded(tmp: Path, env: dict[str, str], store: str, sweep: float) -> Callable[[], Proc]:
    def spawn() -> Proc:
        log = tmp / f"server-{len(list(tmp.glob('server-*.log')))}.log"
        args = ["server", "--embedded", "--store", store, "--sweep-interval", f"{sweep:g}"]
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [TIDEFLOW, *args], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp
            )
        proc = Proc("server", popen, log)
        proc.wait_log("serving:")
        return proc

    return spawn


def test_several_schedules_on_an_embedded_server_without_a_sweep_fire_every_slot(
    tmp_path: Path,
) -> None:
    """Issue 27's reproduction: real time, several schedules, no sweep to hide a lost
    wake-up. Before the fix the server stopped firing within seconds (its next fire time
    in the past for good) in most runs of this test."""
    env = _embedded_env(tmp_path)
    store = f"sqlite:///{tmp_path / 'store.db'}"
    _register(tmp_path, env, "--store", store)
    scenario = Soak(_embedded(tmp_path, env, store, 0.0), store)
    server = scenario.start()
    _pass(20.0)
    scenario.stop(server, kill=False)
    counts = check(asyncio.run(_read_runs(store)), scenario.lives)
    assert counts["s1"] >= 18, counts


def test_soak_sqlite_embedded_server_restarted_by_sigterm_and_sigkill(tmp_path: Path) -> None:
    env = _embedded_env(tmp_path)
    store = f"sqlite:///{tmp_path / 'store.db'}"
    _register(tmp_path, env, "--store", store)
    counts = soak(Soak(_embedded(tmp_path, env, store, SWEEP), store))
    assert counts["s1"] >= 3 * (UP - 2), counts


def test_soak_postgres_cluster_server_restarted_by_sigterm_and_sigkill(cluster: Cluster) -> None:
    """On PostgreSQL with Redis Streams and with NATS JetStream (the fixture's two
    params): one server, its own schema and bus prefix."""
    cluster.env["TIDEFLOW_SWEEP_INTERVAL"] = f"{SWEEP:g}"
    _register(cluster.tmp, cluster.env)
    store_url = cluster.store
    counts = soak(Soak(cluster.server, store_url))
    assert counts["s1"] >= 3 * (UP - 2), counts
