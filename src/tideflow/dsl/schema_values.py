"""The building blocks of `schema`: the check context, key tables, and value validators.

Each validator takes a `Check`, the value and its path, and reports what is wrong
with the value (at its position, with a hint); none raises.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tideflow.dsl.durations import DURATION_HINT, DurationTooLong, parse_duration
from tideflow.dsl.inputs import ActionTypes, input_schema_errors
from tideflow.dsl.loader import DataPath, Reporter, did_you_mean

NAME_RE = re.compile(r"[a-z0-9][a-z0-9_.-]*")
STEP_ID_RE = re.compile(r"[a-z_][a-z0-9_]*")

CASE_KEYS = frozenset({"when", "next"})
EVENT_KEYS = frozenset({"type", "source", "subject", "data"})
TRIGGER_KEYS = frozenset({"event", "match", "input"})
BACKOFFS = ("fixed", "linear", "exponential")

REQUIRED_HINTS = {
    "default": "add `default: [step ids]` (run when no case matches) or `default: fail`",
    "max_iterations": "add `max_iterations: N`; the loop fails with MaxIterationsExceeded "
    "when it reaches N without `until` holding",
    "steps": "add `steps:` with at least one step",
}


def is_template(value: object) -> bool:
    """A string whose value is only known at run time."""
    return isinstance(value, str) and "{{" in value


@dataclass(frozen=True)
class Check:
    """What a validator needs: where to report, the action types, the current step."""

    report: Reporter
    action_types: ActionTypes
    step_id: str | None = None

    def error(
        self, path: DataPath, message: str, hint: str | None, *, at_key: bool = False
    ) -> None:
        self.report.error(path, message, hint=hint, step_id=self.step_id, at_key=at_key)


Validator = Callable[[Check, Any, DataPath], None]


def describe(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    for kind, name in ((int, "an integer"), (float, "a number"), (str, "a string")):
        if isinstance(value, kind):
            return f"{name} ({value!r})"
    return "a list" if isinstance(value, list) else "a mapping"


def check_keys(
    check: Check,
    mapping: Mapping[str, Any],
    path: DataPath,
    allowed: frozenset[str],
    where: str,
    required: tuple[str, ...] = (),
) -> None:
    for key in mapping:
        if key not in allowed:
            suggestion = did_you_mean(key, allowed)
            listing = f"allowed keys {where}: {', '.join(sorted(allowed))}"
            hint = f"did you mean '{suggestion}'?" if suggestion else listing
            check.error((*path, key), f"unknown key '{key}' {where}", hint, at_key=True)
    for key in required:
        if key not in mapping:
            hint = REQUIRED_HINTS.get(key, f"add `{key}: ...`")
            check.error(path, f"missing required key '{key}' {where}", hint)


def expect(
    check: Check, value: Any, path: DataPath, kinds: type | tuple[type, ...], what: str
) -> bool:
    allowed = kinds if isinstance(kinds, tuple) else (kinds,)
    if isinstance(value, kinds) and (bool in allowed or not isinstance(value, bool)):
        return True
    message = f"{label(path)} must be {what}, got {describe(value)}"
    check.error(path, message, f"write {what} here")
    return False


def string(check: Check, value: Any, path: DataPath) -> None:
    expect(check, value, path, str, "a string")


def nonempty_string(check: Check, value: Any, path: DataPath) -> None:
    if expect(check, value, path, str, "a non-empty string") and not value.strip():
        check.error(path, "expected a non-empty string, got an empty one", "write a value here")


def expression(check: Check, value: Any, path: DataPath) -> None:
    if isinstance(value, bool) or (isinstance(value, str) and value.strip()):
        return
    check.error(
        path,
        f"expected an expression string, got {describe(value)}",
        'write an expression such as "{{ inputs.amount > 100 }}"',
    )


def boolean(check: Check, value: Any, path: DataPath) -> None:
    expect(check, value, path, bool, "true or false")


def int_at_least(minimum: int) -> Validator:
    def validate(check: Check, value: Any, path: DataPath) -> None:
        if expect(check, value, path, int, "an integer") and value < minimum:
            hint = f"use a value >= {minimum}"
            message = f"{label(path)} must be at least {minimum}, got {value}"
            check.error(path, message, hint)

    return validate


def article(word: str) -> str:
    return f"an {word}" if word[:1] in "aeiou" or word == "http" else f"a {word}"


def label(path: DataPath) -> str:
    """The key a value belongs to, for messages: ``timeout``, ``next[0]`` -> ``next``."""
    names = [part for part in path if isinstance(part, str)]
    return names[-1] if names else "value"


def not_one_of(check: Check, path: DataPath, what: str, value: Any, known: Iterable[str]) -> None:
    known = sorted(known)
    suggestion = did_you_mean(str(value), known)
    hint = f"did you mean '{suggestion}'? " if suggestion else ""
    check.error(path, f"{what} {value!r}", f"{hint}allowed: {', '.join(known)}")


def enum(*allowed: str) -> Validator:
    def validate(check: Check, value: Any, path: DataPath) -> None:
        if not (isinstance(value, str) and value in allowed):
            not_one_of(check, path, f"invalid {label(path)}", value, allowed)

    return validate


def duration(*, allow_zero: bool) -> Validator:
    def validate(check: Check, value: Any, path: DataPath) -> None:
        try:
            seconds = parse_duration(value)
        except DurationTooLong as exc:
            check.error(path, f"{label(path)}: {exc}", "write a shorter duration")
            return
        except ValueError:
            check.error(path, f"{label(path)} is not a valid duration: {value!r}", DURATION_HINT)
            return
        if seconds < 0 or (seconds == 0 and not allow_zero):
            limit = "zero or more" if allow_zero else "greater than zero"
            message = f"{label(path)} must be {limit}, got {value!r}"
            check.error(path, message, DURATION_HINT)

    return validate


positive_duration = duration(allow_zero=False)
any_duration = duration(allow_zero=True)

BUFFER_HINT = (
    "give how long a signal that arrives before its wait is kept, such as 10m or 1h, "
    "or false to drop it"
)


def buffer_duration(check: Check, value: Any, path: DataPath) -> None:
    """A `wait`'s ``buffer``: a duration (zero or more), or ``false``."""
    if value is False:
        return
    if value is True:
        check.error(path, "buffer: true is not a duration", BUFFER_HINT)
        return
    try:
        seconds = parse_duration(value)
    except ValueError:
        check.error(path, f"buffer is not a valid duration: {value!r}", BUFFER_HINT)
        return
    if seconds < 0:
        check.error(path, f"buffer must be zero or more, got {value!r}", BUFFER_HINT)


def string_list(what: str) -> Validator:
    def validate(check: Check, value: Any, path: DataPath) -> None:
        if not isinstance(value, list):
            example = value if isinstance(value, str) else "a, b"
            hint = f"write [{example}]"
            check.error(path, f"expected a list of {what}, got {describe(value)}", hint)
            return
        for i, item in enumerate(value):
            expect(check, item, (*path, i), str, f"a string ({what[:-1]})")

    return validate


def nonempty_list(inner: Validator, what: str) -> Validator:
    def validate(check: Check, value: Any, path: DataPath) -> None:
        inner(check, value, path)
        if value == []:
            check.error(path, f"the list of {what} is empty", f"name at least one of the {what}")

    return validate


def mapping(check: Check, value: Any, path: DataPath) -> None:
    expect(check, value, path, dict, "a mapping")


def anything(check: Check, value: Any, path: DataPath) -> None:
    return None


def mapping_or_template(check: Check, value: Any, path: DataPath) -> None:
    if isinstance(value, dict) or is_template(value):
        return
    check.error(
        path,
        f"expected a mapping (or one template string), got {describe(value)}",
        'write a mapping such as {order_id: "{{ inputs.order_id }}"}',
    )


def list_or_template(check: Check, value: Any, path: DataPath) -> None:
    if isinstance(value, list) or is_template(value):
        return
    check.error(
        path,
        f"expected a list or a template, got {describe(value)}",
        'write items: "{{ inputs.items }}" or a literal list',
    )


def suggest_id(text: str, pattern: re.Pattern[str], first: str) -> str:
    fixed = re.sub(r"[^a-z0-9_.-]" if first == "0" else r"[^a-z0-9_]", "_", text.lower())
    return fixed if pattern.fullmatch(fixed) else f"{first}{fixed}"


def workflow_name(check: Check, value: Any, path: DataPath) -> None:
    if expect(check, value, path, str, "a string") and not NAME_RE.fullmatch(value):
        check.error(
            path,
            f"invalid name {value!r}: must match [a-z0-9][a-z0-9_.-]*",
            f"use lower case letters, digits, '_', '.', '-', e.g. "
            f"'{suggest_id(value, NAME_RE, '0')}'",
        )


def step_identifier(check: Check, value: Any, path: DataPath) -> None:
    if expect(check, value, path, str, "a string") and not STEP_ID_RE.fullmatch(value):
        check.error(
            path,
            f"invalid step id {value!r}: must match [a-z_][a-z0-9_]*",
            f"use lower case letters, digits and '_', e.g. '{suggest_id(value, STEP_ID_RE, '_')}'",
        )


def version_string(check: Check, value: Any, path: DataPath) -> None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        hint = f'quote it: version: "{value}"'
        check.error(path, f"version must be a string, got {describe(value)}", hint)
    else:
        nonempty_string(check, value, path)


def input_schema(check: Check, value: Any, path: DataPath) -> None:
    if not expect(check, value, path, dict, "a JSON Schema mapping"):
        return
    for where, message, hint in input_schema_errors(value):
        check.error((*path, *where), f"invalid input schema: {message}", hint)
