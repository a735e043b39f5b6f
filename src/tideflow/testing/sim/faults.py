"""The seeded fault schedule, and the Store and Bus wrappers that obey it.

Every call of the engine through a port asks ``Faults.draw`` whether to fail it and how.
The answers come from one ``random.Random(seed)`` in call order; since the simulation
runs on one virtual-time loop with no thread (``loop.py``), the calls come in the same
order for a seed, so a seed is one schedule. Every fault injected is logged
(``Faults.log``) with its virtual time: a failing seed prints what happened to it.

What is injected (``Fault``):

- ``before``: the call raises and did nothing (a commit or a publication fails);
- ``after``: the call did its work, then raises (the caller thinks it failed and tries
  again: a commit applied twice, a run created twice, an event published twice);
- ``duplicate``: a publication is delivered twice;
- ``delay``: a publication is delivered after a virtual delay (up to a minute), so runs'
  events overtake each other;
- ``reorder``: the events of one publication are shuffled across runs (each run's own
  events keep their order: the bus promises that much);
- ``lost``: a worker's outcome (``task_completed``/``task_failed``) never reaches the bus
  and its task is never acknowledged: the worker died between running the attempt and
  reporting it; the delivery's lease runs out and the bus hands the task back.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum

from tideflow.errors import BusError, StoreUnavailable


def _zero() -> float:
    return 0.0


class Fault(Enum):
    BEFORE = "before"
    AFTER = "after"
    DUPLICATE = "duplicate"
    DELAY = "delay"
    REORDER = "reorder"
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class Injected:
    """One fault as it was injected."""

    at: float
    """Virtual seconds since the simulation began."""
    call: int
    """The port call's number (from 1, across both ports)."""
    port: str
    """``store.commit``, ``bus.publish_events``, ..."""
    fault: Fault

    def __str__(self) -> str:
        return f"#{self.call} t={self.at:.3f} {self.port}: {self.fault.value}"


class InjectedStoreFault(StoreUnavailable):
    """What a faulted store call raises: the store's own transient error."""


class InjectedBusFault(BusError):
    """What a faulted bus call raises: the bus's own error."""


@dataclass(slots=True)
class Faults:
    """A seeded fault schedule. ``rate``: the chance that a port call is faulted."""

    seed: int
    rate: float
    now: Callable[[], float] = _zero
    """Virtual seconds since the simulation began (the simulation sets it)."""
    log: list[Injected] = field(default_factory=list)
    calls: int = 0
    armed: bool = True
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def draw(self, port: str, kinds: Sequence[Fault]) -> Fault | None:
        """Whether (and how) to fault this call. Every call draws the same number of
        values whatever the answer, so one fault more or less here shifts nothing after."""
        if not self.armed:
            return None
        self.calls += 1
        roll = self.rng.random()
        pick = self.rng.randrange(len(kinds))
        if roll >= self.rate:
            return None
        fault = kinds[pick]
        self.log.append(Injected(self.now(), self.calls, port, fault))
        return fault

    def uniform(self, low: float, high: float) -> float:
        return self.rng.uniform(low, high)

    @contextlib.contextmanager
    def off(self) -> Iterator[None]:
        """No faults (and no draws) inside: what the simulator reads to check invariants."""
        armed, self.armed = self.armed, False
        try:
            yield
        finally:
            self.armed = armed

    def store_error(self, port: str, fault: Fault) -> InjectedStoreFault:
        return InjectedStoreFault(f"injected: {port} {fault.value} (seed {self.seed})")

    def bus_error(self, port: str, fault: Fault) -> InjectedBusFault:
        return InjectedBusFault(f"injected: {port} {fault.value} (seed {self.seed})")


class Scripted(Faults):
    """Faults at chosen calls only (regression tests): ``script`` maps (port, n) to the
    fault of the n-th call (from 1) of that port, e.g. ``("store.commit", 2): AFTER``."""

    def __init__(self, script: dict[tuple[str, int], Fault]) -> None:
        super().__init__(seed=0, rate=0.0)
        self.script = dict(script)
        self.counts: dict[str, int] = {}

    def draw(self, port: str, kinds: Sequence[Fault]) -> Fault | None:
        if not self.armed:
            return None
        self.calls += 1
        n = self.counts[port] = self.counts.get(port, 0) + 1
        fault = self.script.pop((port, n), None)
        if fault is not None:
            self.log.append(Injected(self.now(), self.calls, port, fault))
        return fault
