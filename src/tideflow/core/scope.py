"""The names an expression sees, built lazily from the run state.

``steps.<id>`` resolves from the innermost scope outwards, so inside loop
iteration 2 ``steps.check`` is that iteration's ``check`` while ``steps.fetch``
is the top-level step the loop depends on.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from tideflow.model.expressions import DRAWS_KEY, Draws
from tideflow.model.run import RunState, StepState
from tideflow.model.secrets import SecretMarkers

_SECRETS = SecretMarkers()


def iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat()


class StepView(Mapping[str, Any]):
    """``steps.<id>``: output, status, error and input of one step instance."""

    __slots__ = ("_st",)
    _KEYS = ("output", "status", "error", "input")

    def __init__(self, st: StepState) -> None:
        self._st = st

    def __getitem__(self, key: str) -> Any:
        st = self._st
        if key == "output":
            return st.output
        if key == "status":
            return st.status.value
        if key == "error":
            return st.error.to_dict() if st.error else None
        if key == "input":
            return st.input
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._KEYS)

    def __len__(self) -> int:
        return len(self._KEYS)


class RunView(Mapping[str, Any]):
    """``run``: id, name, version and started_at of the run."""

    __slots__ = ("_state",)
    _KEYS = ("id", "name", "version", "started_at")

    def __init__(self, state: RunState) -> None:
        self._state = state

    def __getitem__(self, key: str) -> Any:
        state = self._state
        if key == "id":
            return state.run_id
        if key == "name":
            return state.workflow
        if key == "version":
            return state.version
        if key == "started_at":
            return iso(state.started_at)
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._KEYS)

    def __len__(self) -> int:
        return len(self._KEYS)


class StepsView(Mapping[str, Any]):
    """``steps``: step ids visible from one scope, innermost first."""

    __slots__ = ("_chain", "_state")

    def __init__(self, state: RunState, chain: tuple[str, ...]) -> None:
        self._state = state
        self._chain = chain

    def __getitem__(self, step_id: str) -> StepView:
        steps = self._state.steps
        for prefix in self._chain:
            st = steps.get(prefix + step_id)
            if st is not None:
                return StepView(st)
        raise KeyError(step_id)

    def __iter__(self) -> Iterator[str]:
        seen: set[str] = set()
        for prefix in self._chain:
            for key in self._state.scopes[prefix].keys:
                step_id = key[len(prefix) :]
                if step_id not in seen:
                    seen.add(step_id)
                    yield step_id

    def __len__(self) -> int:
        return sum(1 for _ in self)


def scope_chain(state: RunState, prefix: str) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The prefixes from ``prefix`` outwards, and the merged loop/map variables."""
    chain: list[str] = []
    variables: dict[str, Any] = {}
    current: str | None = prefix
    while current is not None:
        scope = state.scopes[current]
        chain.append(current)
        for name, value in scope.vars.items():
            variables.setdefault(name, value)
        current = scope.parent
    return tuple(chain), variables


def build_scope(
    state: RunState, prefix: str, now: float, *, instance: str | None = None, **extra: Any
) -> dict[str, Any]:
    """The expression scope for a step (or loop condition) living in scope ``prefix``;
    ``instance`` (default: the prefix) names what ``uuid()`` / ``random()`` draw for."""
    chain, variables = scope_chain(state, prefix)
    scope: dict[str, Any] = {
        "inputs": state.input,
        "steps": StepsView(state, chain),
        "run": RunView(state),
        "secrets": _SECRETS,
        "__now__": now,
        DRAWS_KEY: Draws(state.run_id, prefix if instance is None else instance),
    }
    scope.update(variables)
    scope.update(extra)
    return scope


def redraw(scope: dict[str, Any], run_id: str, instance: str) -> dict[str, Any]:
    """``scope`` with a draw stream of its own for ``instance`` (an action's config is
    rendered again on every attempt and on recovery: it must draw the same each time)."""
    return {**scope, DRAWS_KEY: Draws(run_id, instance)}
