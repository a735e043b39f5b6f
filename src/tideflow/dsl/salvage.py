"""What of a definition with structural errors the whole-definition checks can still use.

`schema.check_definition` reports every structural problem, but the later checks
(duplicate ids, unknown targets, cycles, expressions, references) need a tree the
normaliser accepts. `salvage` builds one from the parts that passed: a value with
an error under it is left out, a required key that is missing (or left out) gets an
inert placeholder, a step of an unknown type keeps its common keys as a ``noop``,
and a step that cannot be used at all (not a mapping, no string id) becomes a
*hole* that keeps the positions of the steps after it and is not indexed. So one
`tideflow validate` reports a switch without `default` and the cycle and duplicate
id next to it, each once.

The result is only ever checked, never planned: `compile_definition` still fails
when the schema found errors.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from tideflow.dsl.graph import HOLE
from tideflow.dsl.loader import DataPath
from tideflow.dsl.schema import COMMON_STEP_KEYS, DEFAULTS_KEYS, ENGINE_KINDS, TOP_KEYS

__all__ = ["salvage"]

_PLACEHOLDERS: Mapping[str, Any] = {
    "values": {},
    "cases": [],
    "default": "fail",
    "signal": "_",
    "items": [],
    "step": {"type": "noop"},
    "steps": [],
    "max_iterations": 1,
    "workflow": "_",
    "event": {"type": "_"},
}
_NESTED = {("loop", "steps"), ("map", "step")}


class _Errors:
    """The paths errors were reported at, and every prefix of them."""

    def __init__(self, paths: Iterable[DataPath]) -> None:
        self.exact = set(paths)
        self.prefixes = {path[:size] for path in self.exact for size in range(len(path) + 1)}

    def under(self, path: DataPath) -> bool:
        """An error at ``path`` or inside its value."""
        return path in self.prefixes


def salvage(
    data: Any, error_paths: Iterable[DataPath], action_types: Mapping[str, Any]
) -> dict[str, Any] | None:
    """A definition the normaliser accepts, made of the parts of ``data`` without errors;
    None when there are no steps to check."""
    errors = _Errors(error_paths)
    steps = data.get("steps") if isinstance(data, dict) else None
    if not isinstance(steps, list) or not steps or ("steps",) in errors.exact:
        return None
    salvager = _Salvager(errors, frozenset(action_types) | frozenset(ENGINE_KINDS))
    out = {
        key: value
        for key, value in data.items()
        if key in TOP_KEYS and key != "steps" and not errors.under((key,))
    }
    out.setdefault("name", "_")
    out.setdefault("version", "_")
    defaults = data.get("defaults")
    if isinstance(defaults, dict) and ("defaults",) not in errors.exact:
        out["defaults"] = salvager.keep(defaults, ("defaults",), DEFAULTS_KEYS)
    out["steps"] = salvager.steps(steps, ("steps",))
    return out


class _Salvager:
    def __init__(self, errors: _Errors, kinds: frozenset[str]) -> None:
        self.errors = errors
        self.kinds = kinds
        self.holes = 0

    def keep(
        self, raw: Mapping[str, Any], path: DataPath, keys: Iterable[str] | None = None
    ) -> dict[str, Any]:
        allowed = None if keys is None else frozenset(keys)
        return {
            key: value
            for key, value in raw.items()
            if (allowed is None or key in allowed) and not self.errors.under((*path, key))
        }

    def steps(self, raws: list[Any], path: DataPath) -> list[dict[str, Any]]:
        return [self.step(raw, (*path, i), template=False) for i, raw in enumerate(raws)]

    def step(self, raw: Any, path: DataPath, *, template: bool) -> dict[str, Any]:
        step_id = raw.get("id") if isinstance(raw, dict) else None
        usable_id = (isinstance(step_id, str) and step_id != "") or (template and step_id is None)
        if not isinstance(raw, dict) or not usable_id:
            self.holes += 1
            return {"id": f"{HOLE}{self.holes}", "type": "noop"}
        kind = raw.get("type")
        if not isinstance(kind, str) or kind not in self.kinds:
            kept = self.keep(raw, path, COMMON_STEP_KEYS)
            return (
                {**kept, "type": "noop"}
                if step_id is None
                else {**kept, "id": step_id, "type": "noop"}
            )
        out = {**self.keep(raw, path), "type": kind}
        if step_id is not None:
            out["id"] = step_id  # an id of the wrong form is still what others refer to
        if template:
            out.pop("depends_on", None)
        for key in raw:
            if (kind, key) in _NESTED and (*path, key) not in self.errors.exact:
                nested = raw[key]
                at = (*path, key)
                out[key] = (
                    self.steps(nested, at)
                    if key == "steps"
                    else self.step(nested, at, template=True)
                )
        if kind == "switch" and isinstance(raw.get("cases"), list):
            out["cases"] = self.cases(raw["cases"], (*path, "cases"))
        return _complete(kind, out)

    def cases(self, cases: list[Any], path: DataPath) -> list[Any]:
        return [case for i, case in enumerate(cases) if not self.errors.under((*path, i))]


def _complete(kind: str, step: dict[str, Any]) -> dict[str, Any]:
    """Placeholders for what a kind requires; one of `duration` / `until` for a sleep."""
    engine = ENGINE_KINDS.get(kind)
    for key in engine.required if engine else ():
        if key not in step:
            step[key] = copy.deepcopy(_PLACEHOLDERS[key])
    if kind == "sleep":
        if "until" in step:
            step.pop("duration", None)
        else:
            step.setdefault("duration", 0)
    return step
