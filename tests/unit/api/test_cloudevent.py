"""Reading CloudEvents out of a request (api/cloudevent.py), without a server: what each
mode yields, and the cases the HTTP tests do not reach."""

from __future__ import annotations

import pytest

from tideflow.api.cloudevent import EventRefused, read_events

HEADERS = {"ce-id": "1", "ce-source": "urn:s", "ce-type": "t", "ce-specversion": "1.0"}


def test_binary_text_data_is_a_string_and_headers_are_percent_decoded() -> None:
    headers = {**HEADERS, "ce-subject": "caf%C3%A9%20au%20lait", "ce-flag": "true"}
    mode, (event,) = read_events("text/plain; charset=utf-8", headers, "héllo".encode())
    assert mode == "binary"
    assert event.payload() == {
        "id": "1",
        "source": "urn:s",
        "type": "t",
        "specversion": "1.0",
        "subject": "café au lait",
        "flag": "true",  # binary mode: every attribute is a string
        "datacontenttype": "text/plain; charset=utf-8",
        "data": "héllo",
    }


def test_binary_without_a_body_has_no_data() -> None:
    _, (event,) = read_events(None, HEADERS, b"")
    assert "data" not in event.payload()
    assert "datacontenttype" not in event.payload()


def test_a_header_that_is_not_utf8_is_named_once() -> None:
    with pytest.raises(EventRefused) as caught:
        read_events(None, {**HEADERS, "ce-id": "%FF"}, b"")
    assert [(p.field, p.message) for p in caught.value.problems] == [
        ("header ce-id", "not percent-encoded UTF-8")
    ]


def test_an_empty_batch_holds_no_event() -> None:
    assert read_events("application/cloudevents-batch+json; charset=utf-8", {}, b"[]") == (
        "batch",
        [],
    )


def test_structured_mode_ignores_ce_headers_and_null_is_absent() -> None:
    body = b'{"id": "2", "source": "urn:s", "type": "t", "specversion": "1.0", "subject": null}'
    _, (event,) = read_events("application/cloudevents+json", {"ce-id": "other"}, body)
    assert event.id == "2"
    assert "subject" not in event.payload()
    assert "data" not in event.payload()  # no data member: no data, not `data: null`


@pytest.mark.parametrize(
    ("time", "valid"),
    [
        ("2026-01-31T12:00:00Z", True),
        ("2026-01-31t12:00:00.123456789+05:30", True),
        ("2026-02-30T00:00:00Z", False),
        ("2026-01-31 12:00:00Z", False),
        ("2026-01-31T12:00:00", False),  # RFC 3339 needs the offset
    ],
)
def test_time_is_an_rfc3339_timestamp(time: str, valid: bool) -> None:
    body = (
        b'{"id": "2", "source": "urn:s", "type": "t", "specversion": "1.0", "time": "'
        + time.encode()
        + b'"}'
    )
    if valid:
        read_events("application/cloudevents+json", {}, body)
    else:
        with pytest.raises(EventRefused, match="RFC 3339"):
            read_events("application/cloudevents+json", {}, body)
