"""The normalised definition: one canonical, JSON-compatible form per meaning.

Input is a definition that passed `schema.check_definition`. The normal form is
what the plan hash is computed from, so two definitions that mean the same thing
must normalise to the same dict:

- ``defaults`` are applied and removed. They apply to *action* steps (and to
  compensations): an attempt timeout or a queue means nothing for an engine step,
  and a default 30s attempt timeout must not cut a ``sleep``, ``wait``, ``map``
  or ``loop`` short. A step's ``retry`` is merged key by key over
  ``defaults.retry`` (``retry: false`` opts out of retrying entirely).
- Durations are float seconds. ``retry: N`` means ``{max_attempts: N}``; a
  duration as ``backoff`` means ``backoff: fixed`` with that ``initial_delay``; a
  retry block without ``max_attempts`` means 3 attempts.
- Config keys written on an action step move under ``config``.
- A map template without an id gets ``<map_id>_item``.
- A ``switch`` becomes a dependency of each of its targets (the implicit edge).
- Lists whose order carries no meaning (``depends_on``, ``next``, ``default``,
  ``retry_on``, ``sensitive``) are sorted and de-duplicated; expressions are
  written ``{{ expr }}``.
- ``title`` is NFC-normalised (composed), so that one title typed on two keyboards
  is one title with one hash.
- A key whose value equals its built-in default is left out, so a later release
  that adds an optional key does not change the hash of existing definitions.

`normalize` also returns a `Positions` view that maps paths of the normal form
back to where the user wrote them, for the compiler's diagnostics.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

from tideflow.dsl.durations import parse_duration
from tideflow.dsl.inputs import ActionTypes, duration_config_keys
from tideflow.dsl.loader import DataPath, Positions
from tideflow.dsl.schedules import normal_schedules
from tideflow.dsl.schema import ACTION_STEP_KEYS, BACKOFFS, COMPENSATE_KEYS
from tideflow.model.plan import ENGINE_TYPES

__all__ = ["DEFAULT_RETRY_ATTEMPTS", "canonical_expression", "normalize"]

DEFAULT_RETRY_ATTEMPTS = 3
"""Attempts of a retry block that does not say ``max_attempts``."""

_RETRY_DEFAULTS: Mapping[str, Any] = {
    "backoff": "exponential",
    "initial_delay": 1.0,
    "multiplier": 2.0,
    "max_delay": None,
    "jitter": False,
    "retry_on": [],
}
_INHERITED = ("timeout", "queue", "priority")
_ACTION_INHERITED = ("schedule_to_start",)
"""Inherited from ``defaults`` by action steps, not by compensations."""
_DURATIONS = frozenset({"timeout", "schedule_to_start"})
_OMITTED_DEFAULTS: Mapping[str, Any] = {
    "queue": "default",
    "priority": "normal",
    "on_error": "fail",
    "join": "all",
    "cancel_others": False,
    "timeout_action": "fail",
    "mode": "sync",
    "tolerated_failures": 0,
    "delay": 0.0,
    "idempotent": True,
}


def normalize(
    data: Mapping[str, Any], action_types: ActionTypes, positions: Positions
) -> tuple[dict[str, Any], Positions]:
    """The normal form of a valid definition, and positions that read through to the source."""
    normaliser = _Normaliser(data.get("defaults") or {}, action_types)
    out: dict[str, Any] = {"name": data["name"], "version": data["version"]}
    if "title" in data:  # NFC: a title typed on two keyboards is one title, one hash
        out["title"] = unicodedata.normalize("NFC", data["title"])
    for key in ("description", "input", "output"):
        if key in data:
            out[key] = data[key]
    if "timeout" in data:
        out["timeout"] = parse_duration(data["timeout"])
    if "triggers" in data:
        out["triggers"] = [_trigger(t) for t in data["triggers"]]
    if "schedule" in data:
        out["schedule"] = normal_schedules(data["schedule"])
    if data.get("on_failure", "fail") != "fail":
        out["on_failure"] = data["on_failure"]
    out["steps"] = normaliser.steps(data["steps"], ("steps",))
    return out, positions.relinked(normaliser.links)


def canonical_expression(source: str | bool) -> str:
    """``a > 1`` and ``{{ a > 1 }}`` become ``{{ a > 1 }}``; YAML ``false``: ``{{ false }}``."""
    if isinstance(source, bool):
        return "{{ true }}" if source else "{{ false }}"
    text = source.strip()
    inner = text[2:-2] if text.startswith("{{") and text.endswith("}}") else None
    if inner is not None and "{{" not in inner and "}}" not in inner:
        text = inner.strip()
    return "{{ " + text + " }}"


class _Normaliser:
    def __init__(self, defaults: Mapping[str, Any], action_types: ActionTypes) -> None:
        self.defaults = defaults
        self.action_types = action_types
        self.links: dict[DataPath, DataPath] = {}

    def steps(self, raws: list[dict[str, Any]], path: DataPath) -> list[dict[str, Any]]:
        origins: list[dict[str, DataPath]] = []
        steps = [self.step(raw, (*path, i), origins) for i, raw in enumerate(raws)]
        _add_switch_edges(steps, origins, path)
        for i, (step, deps) in enumerate(zip(steps, origins, strict=True)):
            if deps:
                step["depends_on"] = self.sorted_list(deps, (*path, i, "depends_on"))
        return [_drop_defaults(step) for step in steps]

    def step(
        self,
        raw: Mapping[str, Any],
        path: DataPath,
        origins: list[dict[str, DataPath]] | None = None,
        *,
        map_id: str | None = None,
    ) -> dict[str, Any]:
        kind = raw["type"]
        out: dict[str, Any] = {"id": raw.get("id") or f"{map_id}_item", "type": kind}
        if origins is not None:
            deps = raw.get("depends_on") or []
            origins.append(_first_positions(deps, (*path, "depends_on")))
        self.common(raw, path, out, action=kind not in ENGINE_TYPES)
        if kind in ENGINE_TYPES:
            getattr(self, f"engine_{kind}")(raw, path, out)
        else:
            self.config(raw, path, out, ACTION_STEP_KEYS)
        return out

    def common(
        self, raw: Mapping[str, Any], path: DataPath, out: dict[str, Any], *, action: bool
    ) -> None:
        for key in ("description", "join", "cancel_others", "on_error", "input", "idempotent"):
            if key in raw:
                out[key] = raw[key]
        if "when" in raw:
            out["when"] = canonical_expression(raw["when"])
        if "deadline" in raw:
            out["deadline"] = parse_duration(raw["deadline"])
        for key in (*_INHERITED, *_ACTION_INHERITED):
            self.inherit(raw, path, out, key, action=action)
        retry = self.retry(raw, path, inherit=action)
        if retry is not None:
            out["retry"] = retry
        if "compensate" in raw:
            out["compensate"] = self.compensation(raw["compensate"], (*path, "compensate"))
        if raw.get("sensitive"):
            out["sensitive"] = sorted(set(raw["sensitive"]))

    def inherit(
        self, raw: Mapping[str, Any], path: DataPath, out: dict[str, Any], key: str, *, action: bool
    ) -> None:
        if key in raw:
            value = raw[key]
        elif action and key in self.defaults:
            value = self.defaults[key]
            self.links[(*path, key)] = ("defaults", key)
        else:
            return
        out[key] = parse_duration(value) if key in _DURATIONS else value

    def retry(
        self, raw: Mapping[str, Any], path: DataPath, *, inherit: bool
    ) -> dict[str, Any] | None:
        own = raw.get("retry")
        base = self.defaults.get("retry") if inherit else None
        if own is False or (own is None and base in (None, False)):
            return None
        prefix = (*path, "retry")
        mine = self.expand_retry(own, prefix) if own is not None else {}
        merged: dict[str, Any] = {}
        if base not in (None, False):
            merged = self.expand_retry(base, ("defaults", "retry"))
            for key in set(merged) - set(mine):
                self.links[(*prefix, key)] = ("defaults", "retry", key)
        if own is None:
            self.links[prefix] = ("defaults", "retry")
        return _canonical_retry({**merged, **mine})

    def expand_retry(self, value: Any, source: DataPath) -> dict[str, Any]:
        if isinstance(value, int):
            return {"max_attempts": value}
        out = dict(value)
        if out.get("backoff", "exponential") not in BACKOFFS:
            out["initial_delay"] = out.pop("backoff")
            out["backoff"] = "fixed"
            self.links[(*source, "initial_delay")] = (*source, "backoff")
        return out

    def compensation(self, raw: Mapping[str, Any], path: DataPath) -> dict[str, Any]:
        out: dict[str, Any] = {"type": raw["type"]}
        if "input" in raw:
            out["input"] = raw["input"]
        self.inherit(raw, path, out, "timeout", action=True)
        retry = self.retry(raw, path, inherit=True)
        if retry is not None:
            out["retry"] = retry
        self.config(raw, path, out, COMPENSATE_KEYS)
        return out

    def config(
        self, raw: Mapping[str, Any], path: DataPath, out: dict[str, Any], own: Iterable[str]
    ) -> None:
        config = dict(raw.get("config") or {})
        for key, value in raw.items():
            if key not in own and key != "config":
                config[key] = value
                self.links[(*path, "config", key)] = (*path, key)
        for key in duration_config_keys(self.action_types, out["type"]):
            config[key] = _seconds_if_possible(config.get(key))
        if config:
            out["config"] = {key: value for key, value in config.items() if value is not None}

    def sorted_list(self, origins: Mapping[str, DataPath], path: DataPath) -> list[str]:
        values = sorted(origins)
        for i, value in enumerate(values):
            self.links[(*path, i)] = origins[value]
        return values

    def sorted_targets(self, values: list[str], path: DataPath) -> list[str]:
        return self.sorted_list(_first_positions(values, path), path)

    # --- engine steps -------------------------------------------------------------

    def engine_set(self, raw: Mapping[str, Any], path: DataPath, out: dict[str, Any]) -> None:
        out["values"] = raw["values"]

    def engine_switch(self, raw: Mapping[str, Any], path: DataPath, out: dict[str, Any]) -> None:
        out["cases"] = [
            {
                "when": canonical_expression(case["when"]),
                "next": self.sorted_targets(case["next"], (*path, "cases", i, "next")),
            }
            for i, case in enumerate(raw["cases"])
        ]
        default = raw["default"]
        out["default"] = (
            default if default == "fail" else self.sorted_targets(default, (*path, "default"))
        )

    def engine_wait(self, raw: Mapping[str, Any], path: DataPath, out: dict[str, Any]) -> None:
        out["signal"] = raw["signal"]
        if "match" in raw:
            out["match"] = canonical_expression(raw["match"])
        out["timeout_action"] = raw.get("timeout_action", "fail")
        if "buffer" in raw:
            out["buffer"] = _buffer(raw["buffer"])
        elif "buffer" in self.defaults:
            out["buffer"] = _buffer(self.defaults["buffer"])
            self.links[(*path, "buffer")] = ("defaults", "buffer")

    def engine_sleep(self, raw: Mapping[str, Any], path: DataPath, out: dict[str, Any]) -> None:
        if "duration" in raw:
            out["duration"] = parse_duration(raw["duration"])
        else:
            out["until"] = raw["until"]

    def engine_map(self, raw: Mapping[str, Any], path: DataPath, out: dict[str, Any]) -> None:
        out["items"] = raw["items"]
        out["step"] = _drop_defaults(self.step(raw["step"], (*path, "step"), map_id=out["id"]))
        for key in ("max_concurrency", "tolerated_failures"):
            if key in raw:
                out[key] = raw[key]

    def engine_loop(self, raw: Mapping[str, Any], path: DataPath, out: dict[str, Any]) -> None:
        out["steps"] = self.steps(raw["steps"], (*path, "steps"))
        for key in ("until", "while"):
            if key in raw:
                out[key] = canonical_expression(raw[key])
        out["max_iterations"] = raw["max_iterations"]
        if "delay" in raw:
            out["delay"] = parse_duration(raw["delay"])

    def engine_subflow(self, raw: Mapping[str, Any], path: DataPath, out: dict[str, Any]) -> None:
        for key in ("workflow", "version", "mode"):
            if key in raw:
                out[key] = raw[key]

    def engine_emit(self, raw: Mapping[str, Any], path: DataPath, out: dict[str, Any]) -> None:
        out["event"] = raw["event"]


def _add_switch_edges(
    steps: list[dict[str, Any]], origins: list[dict[str, DataPath]], path: DataPath
) -> None:
    """Each target of a switch depends on the switch (within the same graph)."""
    index = {step["id"]: i for i, step in enumerate(steps)}
    for i, step in enumerate(steps):
        if step["type"] != "switch":
            continue
        targets = {t for case in step["cases"] for t in case["next"]}
        targets.update(step["default"] if isinstance(step["default"], list) else ())
        for target in targets:
            if target in index and target != step["id"]:
                origins[index[target]].setdefault(step["id"], (*path, i))


def _first_positions(values: list[str], path: DataPath) -> dict[str, DataPath]:
    """Each value -> the path of its first occurrence in the list at ``path``."""
    first: dict[str, DataPath] = {}
    for i, value in enumerate(values):
        first.setdefault(value, (*path, i))
    return first


def _canonical_retry(merged: Mapping[str, Any]) -> dict[str, Any] | None:
    attempts = merged.get("max_attempts", DEFAULT_RETRY_ATTEMPTS)
    if attempts == 1:
        return None
    policy: dict[str, Any] = {"max_attempts": attempts, **_RETRY_DEFAULTS, **merged}
    for key in ("initial_delay", "max_delay"):
        if policy[key] is not None:
            policy[key] = parse_duration(policy[key])
    policy["multiplier"] = float(policy["multiplier"])
    policy["retry_on"] = sorted(set(policy["retry_on"]))
    return {key: value for key, value in policy.items() if _RETRY_DEFAULTS.get(key, ...) != value}


def _trigger(raw: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"event": raw["event"]}
    if "match" in raw:
        out["match"] = canonical_expression(raw["match"])
    if "input" in raw:
        out["input"] = raw["input"]
    return out


def _buffer(value: Any) -> float:
    """A `wait`'s ``buffer`` in seconds: ``false`` drops early signals (0)."""
    return 0.0 if value is False else parse_duration(value)


def _drop_defaults(step: dict[str, Any]) -> dict[str, Any]:
    return {
        key: value
        for key, value in step.items()
        if key not in _OMITTED_DEFAULTS or _OMITTED_DEFAULTS[key] != value
    }


def _seconds_if_possible(value: Any) -> Any:
    try:
        return parse_duration(value) if value is not None else None
    except ValueError:
        return value
