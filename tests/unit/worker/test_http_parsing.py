"""Pure helpers of the http executor: Retry-After and response body decoding."""

from __future__ import annotations

from email.utils import formatdate

import pytest

from tideflow.worker.executors.http import decode_body, parse_retry_after


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("120", 120.0),
        (" 1.5 ", 1.5),
        ("-3", 0.0),
        ("", None),
        (None, None),
        ("soon", None),
        ("inf", None),
    ],
)
def test_retry_after_seconds(header: str | None, expected: float | None) -> None:
    assert parse_retry_after(header) == expected


def test_retry_after_http_date() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after(formatdate(now + 90, usegmt=True), now=now) == 90.0
    assert parse_retry_after(formatdate(now - 90, usegmt=True), now=now) == 0.0


@pytest.mark.parametrize(
    ("ctype", "raw", "expected"),
    [
        ("application/json", b'{"a": 1}', {"body": {"a": 1}}),
        ("application/problem+json; charset=utf-8", b'{"title": "x"}', {"body": {"title": "x"}}),
        ("application/json", b"", {"body": None}),
        ("text/plain; charset=latin-1", "caf\u00e9".encode("latin-1"), {"body": "caf\u00e9"}),
        ("text/plain; charset=no-such-charset", b"ok", {"body": "ok"}),
        ("", b"\xffok", {"body": "\ufffdok"}),
    ],
)
def test_decode_body(ctype: str, raw: bytes, expected: dict[str, object]) -> None:
    assert decode_body(ctype, raw) == expected


def test_malformed_json_body() -> None:
    out = decode_body("application/json", b"[1, 2")
    assert out["body"] == "[1, 2"
    assert isinstance(out["body_parse_error"], str)


@pytest.mark.parametrize("n", [2**70, -(2**70), 2**64])
def test_a_json_body_with_an_integer_past_64_bits_is_kept_as_text_not_rounded(n: int) -> None:
    raw = b'{"id": [1, %d]}' % n
    out = decode_body("application/json", raw)
    assert out["body"] == raw.decode()
    assert str(out["body_parse_error"]).startswith(f"body.id[1]: the integer {n} is out of range")


def test_a_json_body_with_two_to_the_63_is_exact() -> None:
    assert decode_body("application/json", b'{"id": %d}' % 2**63) == {"body": {"id": 2**63}}
