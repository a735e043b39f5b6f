"""User regexes on RE2: a definition's JSON Schema patterns run in linear time.

A definition's ``input`` schema is written by whoever registers it and applied to what
outside callers send (a run input, an event that starts a run). Python's ``re`` (what
jsonschema uses) backtracks: ``^(a+)+$`` against forty ``a`` and a ``!`` runs for
minutes, holding the server's event loop. RE2 (google-re2) matches in time linear in
the text, and refuses what it cannot match so (backreferences, lookaround), so:

- `regex_refusal` says why RE2 does not take a pattern; the compiler refuses such a
  pattern in ``input`` (`input_schema_problems`), naming it;
- `stored_definitions` lets a definition registered before (with such a pattern) load:
  its runs go on, and its pattern matches nothing;
- `InputValidator` is jsonschema's draft 2020-12 validator with every keyword that
  applies a schema's regexes (``pattern``, ``patternProperties``,
  ``additionalProperties``, ``unevaluatedProperties``) on RE2, and `INPUT_FORMATS`
  checks ``format: regex`` with RE2.

Syntax is RE2's (docs/dsl.md): ``\\d``, ``\\w`` and ``\\b`` are ASCII, ``\\z`` ends the
text (Python's ``\\Z``), and there is no ``(?=…)``, ``(?!…)``, ``(?<=…)`` or ``\\1``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any, Protocol, cast

import re2
from jsonschema import Draft202012Validator, FormatChecker, ValidationError, validators
from jsonschema.protocols import Validator

__all__ = [
    "INPUT_FORMATS",
    "RE2_HINT",
    "InputValidator",
    "input_schema_problems",
    "regex_refusal",
    "stored_definitions",
]

RE2_HINT = (
    "patterns are RE2 syntax (linear time): no backreferences (\\1) and no lookaround "
    "((?=…), (?!…), (?<=…), (?<!…)); see docs/dsl.md#input-patterns"
)


class _Regex(Protocol):
    def search(self, text: str) -> object | None: ...


_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is reported to its author, not to stderr


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> _Regex:
    return cast(_Regex, re2.compile(pattern, _OPTIONS))


def regex_refusal(pattern: str) -> str | None:
    """Why RE2 does not take ``pattern`` (None: it does)."""
    try:
        _compiled(pattern)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "not a regex"
        return reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)
    return None


def _search(pattern: str, text: str) -> bool:
    """Whether ``pattern`` matches in ``text``; never, for a pattern RE2 refuses (one of a
    definition stored before patterns ran on RE2: `stored_definitions`)."""
    try:
        regex = _compiled(pattern)
    except re2.error:
        return False
    return regex.search(text) is not None


_STORED = ContextVar("tideflow_stored_definitions", default=False)


@contextlib.contextmanager
def stored_definitions() -> Iterator[None]:
    """Compile definitions stored already: a pattern RE2 refuses does not stop the plan
    from loading (its runs go on); it matches nothing, so a new run's input is refused
    with a message that says why, and never reaches a backtracking engine."""
    token = _STORED.set(True)
    try:
        yield
    finally:
        _STORED.reset(token)


# --- checking an input schema when a definition is compiled ---------------------------


def _is_regex(instance: object) -> bool:
    if isinstance(instance, str) and (reason := regex_refusal(instance)) is not None:
        raise ValueError(reason)
    return True


_REGEX_ONLY = FormatChecker(formats=())
_REGEX_ONLY.checks("regex", raises=ValueError)(_is_regex)
_META = Draft202012Validator(Draft202012Validator.META_SCHEMA, format_checker=_REGEX_ONLY)


SCHEMA_HINT = "fix the JSON Schema (draft 2020-12)"


def input_schema_problems(schema: Mapping[str, Any]) -> list[tuple[tuple[Any, ...], str, str]]:
    """Where, why and what to do: ``schema`` is no valid draft 2020-12 schema, or holds a
    pattern (a ``pattern``, a ``patternProperties`` key) that RE2 does not take."""
    problems = []
    for error in sorted(_META.iter_errors(schema), key=_relevance):
        where = tuple(error.absolute_path)
        if error.validator == "format" and isinstance(error.instance, str):
            if _STORED.get():
                continue
            if where and where[-1] == "patternProperties":
                where = (*where, error.instance)  # the key is the pattern
            reason = error.cause or "not a regex"
            message = f"pattern {error.instance!r} is refused by RE2: {reason}"
            problems.append((where, message, RE2_HINT))
        else:
            problems.append((where, error.message, SCHEMA_HINT))
    return problems


def _relevance(error: ValidationError) -> tuple[int, bool, str]:
    """Errors higher up in the schema first; anyOf/oneOf summaries after the rest."""
    return len(error.path), error.validator in ("anyOf", "oneOf"), str(list(error.path))


# --- validating with the patterns on RE2 ----------------------------------------------
# These are jsonschema's own keyword functions (jsonschema/_keywords.py, _utils.py, MIT),
# with ``re.search`` replaced by RE2: the same results and messages for every pattern
# both engines take.


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        if (refusal := regex_refusal(pattern)) is not None:
            yield ValidationError(
                f"{pattern!r} cannot be checked: RE2 refuses it ({refusal}); register a "
                "version of the workflow whose pattern RE2 takes"
            )
        else:
            yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: Mapping[str, Any], instance: Any, schema: Any
) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional(instance: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    return [
        key
        for key in instance
        if key not in properties and not any(_search(p, key) for p in patterns)
    ]


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    extras = set(_additional(instance, schema))
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        if "patternProperties" in schema:
            verb = "does" if len(extras) == 1 else "do"
            joined = ", ".join(repr(each) for each in sorted(extras))
            patterns = ", ".join(repr(each) for each in sorted(schema["patternProperties"]))
            yield ValidationError(f"{joined} {verb} not match any of the regexes: {patterns}")
        else:
            names, verb = _listed(sorted(extras, key=str))
            yield ValidationError(
                f"Additional properties are not allowed ({names} {verb} unexpected)"
            )


def _evaluated_keys(validator: Any, instance: Mapping[str, Any], schema: Any) -> list[str]:
    """The keys of ``instance`` that ``schema`` evaluates (for ``unevaluatedProperties``)."""
    if validator.is_type(schema, "boolean"):
        return []
    keys: list[str] = []
    for keyword in ("$ref", "$dynamicRef"):
        reference = schema.get(keyword)
        if reference is not None:
            resolved = validator._resolver.lookup(reference)
            evolved = validator.evolve(schema=resolved.contents, _resolver=resolved.resolver)
            keys += _evaluated_keys(evolved, instance, resolved.contents)
    properties = schema.get("properties")
    if validator.is_type(properties, "object"):
        keys += properties.keys() & instance.keys()
    for keyword in ("additionalProperties", "unevaluatedProperties"):
        if (subschema := schema.get(keyword)) is not None:
            keys += (
                key
                for key, value in instance.items()
                if not next(validator.descend(value, subschema), None)
            )
    for pattern in schema.get("patternProperties", {}):
        keys += (key for key in instance if _search(pattern, key))
    for key, subschema in schema.get("dependentSchemas", {}).items():
        if key in instance:
            keys += _evaluated_keys(validator, instance, subschema)
    for keyword in ("allOf", "oneOf", "anyOf"):
        for subschema in schema.get(keyword, []):
            if not next(validator.descend(instance, subschema), None):
                keys += _evaluated_keys(validator, instance, subschema)
    if "if" in schema:
        if validator.evolve(schema=schema["if"]).is_valid(instance):
            keys += _evaluated_keys(validator, instance, schema["if"])
            if "then" in schema:
                keys += _evaluated_keys(validator, instance, schema["then"])
        elif "else" in schema:
            keys += _evaluated_keys(validator, instance, schema["else"])
    return keys


def _unevaluated_properties(
    validator: Any, unevaluated: Any, instance: Any, schema: Any
) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    evaluated = _evaluated_keys(validator, instance, schema)
    refused = [
        key
        for key in instance
        if key not in evaluated
        and next(validator.descend(instance[key], unevaluated, path=key, schema_path=key), None)
    ]
    if not refused:
        return
    if unevaluated is False:
        names, verb = _listed(sorted(refused, key=str))
        yield ValidationError(f"Unevaluated properties are not allowed ({names} {verb} unexpected)")
    else:
        names, verb = _listed(refused)
        yield ValidationError(
            "Unevaluated properties are not valid under the given schema "
            f"({names} {verb} unevaluated and invalid)"
        )


def _listed(keys: list[str]) -> tuple[str, str]:
    return ", ".join(repr(key) for key in keys), "was" if len(keys) == 1 else "were"


InputValidator: type[Validator] = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator,
    {
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
        "unevaluatedProperties": _unevaluated_properties,
    },
)
"""Draft 2020-12 with the schema's regexes on RE2 (check formats with `INPUT_FORMATS`)."""


def _input_formats() -> FormatChecker:
    checker = FormatChecker(formats=())
    checker.checkers = dict(Draft202012Validator.FORMAT_CHECKER.checkers)
    checker.checks("regex", raises=ValueError)(_is_regex)
    return checker


INPUT_FORMATS = _input_formats()
"""Draft 2020-12's format checks, ``format: regex`` by RE2 (what the patterns run on)."""
