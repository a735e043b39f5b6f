"""Which signals a run accepts: the names its plan's `wait` steps declare.

A signal is accepted when some `wait` step anywhere in the run's plan (top level,
inside a loop or map body, on a switch branch) waits for its name, whether that
wait is active now, comes later (the signal is then kept until it starts), or has
already finished. Any other name is refused with ``UnknownSignal``: no step of the
run could ever take it, so keeping it would only hide a typo. Sub-workflows are
runs of their own: a child's waits do not make its parent accept a name.
"""

from __future__ import annotations

import functools

from tideflow.errors import UnknownSignal
from tideflow.model.plan import Plan


@functools.lru_cache(maxsize=256)
def declared_signals(plan: Plan) -> frozenset[str]:
    """The signal names the plan's `wait` steps wait for."""
    return frozenset(spec.wait.signal for spec in plan.specs.values() if spec.wait is not None)


def refuse_undeclared_signal(plan: Plan, run_id: str, name: str) -> None:
    """``UnknownSignal`` naming the run and the names it does wait for, unless one of the
    plan's `wait` steps waits for ``name``."""
    declared = declared_signals(plan)
    if name in declared:
        return
    takes = (
        f"its wait steps take {', '.join(repr(n) for n in sorted(declared))}"
        if declared
        else "it has no wait step"
    )
    raise UnknownSignal(
        f"run {run_id} ({plan.name} {plan.version}) does not wait for a signal named "
        f"{name!r}: {takes}"
    )


__all__ = ["declared_signals", "refuse_undeclared_signal"]
