"""One seed, simulated: a runtime on a faulted store and bus, on virtual time, running a
few workloads to their end through restarts, then every invariant checked.

``simulate(seed)`` derives everything from the seed: the store (memory, or SQLite for
one seed in ``SQLITE_EVERY``), the fault rate, the workloads and their inputs, when
signals and cancels are sent, when the runtime is restarted (closed while runs are in
flight, and a new one started on the same store with a new, empty bus: what a crash of
an embedded process leaves) and every fault at every port call. It returns the
``Outcome``: the fault log, every run's history, and the invariants that failed (none,
or the seed found a bug).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import os
import random
import socket
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tideflow.errors import StoreError, TideflowError
from tideflow.runtime.runtime import Runtime
from tideflow.store.base import HistoryEntry, Store
from tideflow.testing.sim.bus import SimBus
from tideflow.testing.sim.faults import Faults
from tideflow.testing.sim.loop import SimClock, VirtualLoop
from tideflow.testing.sim.stores import FaultyStore, SimMemoryStore, SimSqliteStore
from tideflow.testing.sim.workloads import BUILDS, CHILD, JOURNAL, Workload, register_functions
from tideflow.worker.executors.registry import ExecutorRegistry

T = TypeVar("T")

REPORTED = 40
"""Faults a report lists (the first ones: what comes after is mostly periodic reads)."""

SQLITE_EVERY = 5
"""One seed in this many runs on the SQLite store (in memory), the others on memory."""
HORIZON = 7 * 86_400.0
"""Virtual seconds the workloads have to end in (a run still going after that is stuck)."""
SETTLE = 120.0
"""Virtual seconds left after the last run ended, for effects still being relayed."""
WORKER = f"{socket.gethostname()}/{os.getpid()}"
"""How this process's worker signs the attempts it starts (in the history)."""
SWEEP = 30.0
"""Virtual seconds between two sweep rounds (the default: its repairs are part of what is
simulated)."""


@dataclass(slots=True)
class Outcome:
    """What became of a seed: its scenario, the faults injected, every run's history and
    the invariants that did not hold (empty: all did)."""

    seed: int
    store: str
    rate: float
    workloads: list[str]
    restarts: list[float]
    faults: list[str]
    histories: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    virtual_seconds: float = 0.0

    @property
    def digest(self) -> str:
        """A fingerprint of everything that happened (two replays of a seed agree)."""
        text = json.dumps(
            {"faults": self.faults, "histories": self.histories}, sort_keys=True, default=str
        ).replace(WORKER, "worker")  # the one thing that differs from process to process
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def report(self) -> str:
        lines = [
            f"seed {self.seed}: store {self.store}, fault rate {self.rate:.3f}, "
            f"workloads {', '.join(self.workloads)}, restarts at {self.restarts}, "
            f"{len(self.faults)} fault(s), {self.virtual_seconds:.1f} virtual s, "
            f"digest {self.digest}",
            *(f"  fault {f}" for f in self.faults[:REPORTED]),
            *(
                [f"  ... and {len(self.faults) - REPORTED} more fault(s)"]
                if len(self.faults) > REPORTED
                else []
            ),
            *(f"  VIOLATION {v}" for v in self.violations),
            f"  replay: python -m tideflow.testing.sim --seed {self.seed}",
        ]
        return "\n".join(lines)


def simulate(seed: int, *, verbose: bool = False) -> Outcome:
    """Simulate ``seed`` on a virtual-time loop of its own (call it outside any loop)."""
    register_functions()
    loop = VirtualLoop()
    logger = logging.getLogger("tideflow")
    level = logger.level
    if not verbose:  # injected faults are logged at length: not thousands of times
        logger.setLevel(logging.CRITICAL + 1)
    try:
        result: Outcome = loop.run_to_end(_World(seed, loop).run())
        return result
    finally:
        logger.setLevel(level)


class _World:
    def __init__(self, seed: int, loop: VirtualLoop) -> None:
        self.seed = seed
        self.loop = loop
        self.clock = SimClock(loop)
        plan = random.Random(seed)  # the scenario; the faults draw from a stream of their own
        self.rate = plan.choice((0.0, 0.02, 0.05, 0.1, 0.2))
        self.faults = Faults(seed=seed ^ 0x5EED, rate=self.rate, now=loop.time)
        sqlite = seed % SQLITE_EVERY == 0
        self.store: FaultyStore = (
            SimSqliteStore(self.faults) if sqlite else SimMemoryStore(self.faults)
        )
        kinds = plan.sample(sorted(BUILDS), plan.randrange(1, 4))
        self.workloads: list[Workload] = [
            BUILDS[kind](plan, f"s{seed}-{n}-{kind}") for n, kind in enumerate(kinds)
        ]
        self.restarts = sorted(
            round(plan.uniform(0.0, 90.0), 3) for _ in range(plan.choice((0, 0, 1, 2)))
        )
        self.generation = 0
        self.sent: dict[str, list[Callable[[Runtime], Awaitable[Any]]]] = {}
        """Run id -> the requests the simulator made of it, in order."""
        self.outcome = Outcome(
            seed=seed,
            store="sqlite" if sqlite else "memory",
            rate=self.rate,
            workloads=[w.kind for w in self.workloads],
            restarts=self.restarts,
            faults=[],
        )

    # -- the runtime, and its restarts -------------------------------------------

    async def boot(self) -> Runtime:
        """A new runtime on the store (what a restarted process is); a start that the
        faults break is given up (closed) and tried again."""
        while True:
            self.generation += 1
            runtime = Runtime(
                store=self.store,
                bus=SimBus(self.faults, self.clock),
                clock=self.clock,
                executors=ExecutorRegistry(discover=False),  # built-ins only: no entry points
                workers=8,
                lease=False,
                sweep_interval=SWEEP,
                gc_threshold=None,
            )
            # Event ids are "<prefix>-<n>"; the prefix is random per runtime: pin it so
            # that a replay writes the same history.
            runtime._prefix = f"g{self.generation}"
            # The worker draws a failed attempt's jitter seed from an OS-seeded random:
            # seed it from the scenario.
            runtime._workers._random = random.Random(self.seed * 1000 + self.generation)
            try:
                await runtime.start()
                return runtime
            except TideflowError:
                await _quietly(runtime.close())
                await asyncio.sleep(1.0)

    async def run(self) -> Outcome:
        JOURNAL.clear()
        rt = self.runtime = await self.boot()
        await self.retrying(lambda rt: rt.register(CHILD))
        began = self.loop.time()
        actions = [asyncio.ensure_future(self.drive(w, began)) for w in self.workloads]
        redos = actions  # the same list: cancelled together at the end
        try:
            for at in self.restarts:
                await asyncio.sleep(max(0.0, began + at - self.loop.time()))
                self.runtime = None  # a client call made meanwhile waits for the next one
                await _quietly(rt.close())
                rt = self.runtime = await self.boot()
                redos.append(asyncio.ensure_future(self.again()))
            await self.until_ended(began)
            await asyncio.sleep(SETTLE)
            with self.faults.off():
                await self.check(rt)
        finally:
            for action in actions:
                action.cancel()
            await asyncio.gather(*actions, return_exceptions=True)
            with self.faults.off():
                await _quietly(rt.close())
                await self.store.shutdown()
        self.outcome.faults = [str(f) for f in self.faults.log]
        self.outcome.virtual_seconds = self.loop.time()
        return self.outcome

    runtime: Runtime | None = None
    """The live runtime; None while it is being restarted."""

    async def retrying(self, call: Callable[[Runtime], Awaitable[T]]) -> T:
        """A client call on the live runtime, tried again while the faults break it (same
        ids: idempotent), and again when the runtime was restarted under it: what it did
        may have been lost with the runtime's bus, as its caller would have been."""
        for _ in range(1000):
            rt = self.runtime
            if rt is None:
                await asyncio.sleep(1.0)
                continue
            try:
                result = await call(rt)
            except (StoreError, TideflowError, ConnectionError):
                await asyncio.sleep(1.0)
                continue
            if rt is self.runtime:
                return result
        raise AssertionError("a client call failed 1000 times in a row")

    # -- what the simulator does to the runs -------------------------------------

    async def drive(self, w: Workload, began: float) -> None:
        """Start the run (its id as idempotency key: a start tried again after a fault
        that came after the write finds the run), then signal or cancel it on time."""
        await self.act(
            w, lambda rt: rt.start_run(w.plan, w.input, run_id=w.run_id, idempotency_key=w.run_id)
        )
        if w.signal is not None:
            at, name, payload = w.signal
            await asyncio.sleep(max(0.0, began + at - self.loop.time()))
            await self.act(
                w, lambda rt: rt.signal(w.run_id, name, payload, signal_id=f"{w.run_id}:sig")
            )
        if w.cancel_at is not None:
            await asyncio.sleep(max(0.0, began + w.cancel_at - self.loop.time()))
            await self.act(w, lambda rt: rt.cancel(w.run_id, "the simulator cancels"))

    async def act(self, w: Workload, call: Callable[[Runtime], Awaitable[Any]]) -> None:
        self.sent.setdefault(w.run_id, []).append(call)
        await self.retrying(call)

    async def again(self) -> None:
        """After a restart: what the simulator asked of the runtime that died may have died
        with its bus (an event published, not applied yet), as the caller would have with
        it: each workload's requests are made again, in order (each is idempotent: the
        run's id as idempotency key, the signal's id, a cancel of a run that is already
        cancelling changes nothing)."""

        async def redo(calls: list[Callable[[Runtime], Awaitable[Any]]]) -> None:
            for call in list(calls):
                await self.retrying(call)

        await asyncio.gather(*(redo(calls) for calls in self.sent.values()))

    async def until_ended(self, began: float) -> None:
        """Wait (virtual time) until no run is unfinished, or the horizon passes."""
        step = 1.0
        while self.loop.time() - began < HORIZON:
            with self.faults.off():
                left = await self.store.unfinished_runs()
                started = [await _exists(self.store, w.run_id) for w in self.workloads]
            if not left and all(started):
                return
            await asyncio.sleep(step)
            step = min(step * 1.5, 600.0)

    # -- invariants ----------------------------------------------------------------

    async def check(self, rt: Runtime) -> None:
        bad = self.outcome.violations
        store = self.store
        left = await store.unfinished_runs()
        if left:
            bad.append(f"runs not ended after {HORIZON:.0f} virtual s: {sorted(left)}")
        runs = [w.run_id for w in self.workloads] + [c for w in self.workloads for c in w.children]
        for run_id in runs:
            try:
                history = await store.history(run_id)
            except TideflowError as exc:
                bad.append(f"{run_id}: no history ({exc})")
                continue
            self.outcome.histories[run_id] = [_entry(e) for e in history]
            _check_history(run_id, history, bad)
        for w in self.workloads:
            await self.check_workload(rt, w, bad)
        ended = set(runs) - set(left)
        relayed = rt.relayed_outbox
        for task in await store.tasks_in_flight():
            if task.run_id in ended:
                bad.append(f"{task.run_id}: attempt {task.step_key}#{task.attempt} in flight")
        for timer in await store.due_timers(math.inf, 100_000):
            if timer.run_id in ended:
                bad.append(f"{timer.run_id}: timer {timer.timer_id} still armed")
        for item in await store.pending_outbox(100_000):
            if item.run_id in ended and item.id not in relayed:
                bad.append(f"{item.run_id}: outbox {item.id} never relayed")

    async def check_workload(self, rt: Runtime, w: Workload, bad: list[str]) -> None:
        try:
            result = await rt.result(w.run_id)
        except TideflowError as exc:
            bad.append(f"{w.run_id}: cannot be read ({exc})")
            return
        if result.status != w.status:
            bad.append(f"{w.run_id}: ended {result.status}, expected {w.status} ({result.error})")
            return
        if w.check_output and result.output != w.output:
            bad.append(f"{w.run_id}: output {result.output!r}, expected {w.output!r}")
        for key, end in w.steps.items():
            step = result.steps.get(key)
            if step is None:
                bad.append(f"{w.run_id}: no step {key}")
                continue
            if step.status != end.status:
                bad.append(f"{w.run_id}: step {key} {step.status}, expected {end.status}")
            if end.attempts is not None and step.attempts != end.attempts:
                bad.append(
                    f"{w.run_id}: step {key} made {step.attempts} attempt(s), "
                    f"expected {end.attempts}"
                )
            if end.error is not None and (step.error or {}).get("type") != end.error:
                bad.append(f"{w.run_id}: step {key} error {step.error}, expected {end.error}")
        for key, step in result.steps.items():
            allowed = w.max_attempts.get(key, 1)
            if step.attempts > allowed:
                bad.append(
                    f"{w.run_id}: step {key} made {step.attempts} attempts, "
                    f"its policy allows {allowed}"
                )
        ran = {(key, attempt) for run, key, attempt in JOURNAL if run == w.run_id}
        for key, end in w.steps.items():  # an outcome recorded is one a function returned
            if end.status == "succeeded" and end.attempts and (key, end.attempts) not in ran:
                bad.append(f"{w.run_id}: step {key} succeeded, its attempt never ran")
        if w.compensations:
            undone = _compensation_order(self.outcome.histories.get(w.run_id, []))
            if undone != w.compensations:
                bad.append(f"{w.run_id}: compensated {undone}, expected {w.compensations}")
            never = [n for n in w.compensations if (f"undo:{n}", 1) not in ran]
            if never:
                bad.append(f"{w.run_id}: compensations {never} recorded, never run")


def _entry(entry: HistoryEntry) -> dict[str, Any]:
    return {
        "seq": entry.seq,
        "time": entry.time,
        "kind": entry.kind,
        "event": entry.event,
        "transitions": entry.transitions,
    }


def _check_history(run_id: str, history: list[HistoryEntry], bad: list[str]) -> None:
    seqs = [e.seq for e in history]
    if seqs != list(range(1, len(history) + 1)):
        bad.append(f"{run_id}: history seq {seqs} has gaps or repeats")
    ids = Counter(e.event.get("event_id") for e in history)
    twice = sorted(str(i) for i, n in ids.items() if n > 1)
    if twice:
        bad.append(f"{run_id}: events applied twice: {twice}")
    completed = Counter(
        (e.event.get("step_key"), e.event.get("compensation", False))
        for e in history
        if e.kind == "task_completed" and e.transitions
    )
    again = sorted(str(k) for k, n in completed.items() if n > 1)
    if again:
        bad.append(f"{run_id}: completions applied twice: {again}")


def _compensation_order(history: list[dict[str, Any]]) -> list[str]:
    order: list[str] = []
    for entry in history:
        for t in entry["transitions"]:
            key = str(t.get("subject") or "")
            if key.endswith(":compensate") and t.get("new") == "running":
                name = key.removesuffix(":compensate")
                if name not in order:
                    order.append(name)
    return order


async def _exists(store: Store, run_id: str) -> bool:
    try:
        await store.get_run(run_id)
    except TideflowError:
        return False
    return True


async def _quietly(call: Any) -> None:
    try:
        await call
    except Exception:  # a runtime closing under faults may fail to: the next one recovers
        logging.getLogger("tideflow.sim").debug("closing failed", exc_info=True)
