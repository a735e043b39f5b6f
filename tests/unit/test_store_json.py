"""The JSON every store writes (``sqlbase.dumps``): keys that are not strings are kept
as strings, and a value JSON cannot hold is refused with the same words."""

from __future__ import annotations

import enum

import pytest

from tideflow.store.base import UnstorableData
from tideflow.store.sqlbase import dumps


class Colour(enum.Enum):
    RED = 1


def test_keys_that_are_not_strings_are_written_as_strings_at_any_depth() -> None:
    value = {"a": {1: "x", None: [{True: 1.5}]}, 2.5: Colour.RED}
    assert dumps(value) == '{"a":{"1":"x","null":[{"true":1.5}]},"2.5":1}'


def test_string_keys_and_unknown_values_are_written_as_before() -> None:
    assert dumps({"b": 1, "a": [None, object]}) == '{"b":1,"a":[null,"<class \'object\'>"]}'


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ({"n": 2**70}, "Integer exceeds 64-bit range"),
        ({1: 2**70}, "Integer exceeds 64-bit range"),
        ({"s": "\ud800"}, "str is not valid UTF-8: surrogates not allowed"),
    ],
)
def test_a_value_json_cannot_hold_is_refused(value: object, reason: str) -> None:
    with pytest.raises(UnstorableData) as caught:
        dumps(value)
    assert caught.value.message == f"a value cannot be stored as JSON: {reason}"
