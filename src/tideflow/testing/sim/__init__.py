"""Deterministic simulation of the engine: one process, one virtual-time event loop, a
seeded fault at every port call (docs/reliability.md, "Deterministic simulation").

``simulate(seed)`` runs one seed and returns its ``Outcome`` (``violations`` empty when
every invariant held); ``python -m tideflow.testing.sim --seed N`` replays one seed and
prints what happened to it.
"""

from tideflow.testing.sim.faults import Fault, Faults, Injected, Scripted
from tideflow.testing.sim.loop import SimClock, Stalled, VirtualLoop
from tideflow.testing.sim.simulate import Outcome, simulate

__all__ = [
    "Fault",
    "Faults",
    "Injected",
    "Outcome",
    "Scripted",
    "SimClock",
    "Stalled",
    "VirtualLoop",
    "simulate",
]
