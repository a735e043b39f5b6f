"""Property tests of the parsers at the HTTP edge (Hypothesis): the CloudEvents reader
takes any content type, any headers and any body and answers with events or
`EventRefused`; an ``Authorization`` header of any form is a principal or
`Unauthenticated`; a ``traceparent``/``tracestate`` of any form is a context (an empty
one when it is not valid) and never an exception.

Bounded for CI: at most ``EXAMPLES`` draws a test, no deadline (the machine is shared)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider

from tideflow.api.auth import Principal, authenticate, issue_token, parse_authorization
from tideflow.api.cloudevent import BATCH, STRUCTURED, CloudEvent, EventRefused, read_events
from tideflow.errors import Unauthenticated
from tideflow.model.tokens import Role
from tideflow.observability.tracing import Tracing
from tideflow.store.backends.memory import MemoryStore

EXAMPLES = 150
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

CONTENT_TYPES = st.one_of(
    st.none(),
    st.text(max_size=40),
    st.sampled_from(
        [
            STRUCTURED,
            BATCH,
            f"{STRUCTURED}; charset=utf-8",
            "application/cloudevents+xml",
            "application/json",
            "text/plain",
            "application/octet-stream",
            "APPLICATION/CLOUDEVENTS+JSON",
            "",
        ]
    ),
)
ATTRIBUTE_NAMES = st.sampled_from(
    [
        *("id", "source", "specversion", "type", "time", "subject", "datacontenttype"),
        *("dataschema", "tideflowrunid", "data", "data_base64", "Bad-Name", "x" * 21, "ext1"),
    ]
)
VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.sampled_from([2**31, 2**63, 2**64, 2**70, -(2**70)]),
        st.floats(allow_nan=False),
        st.text(max_size=20),
        st.sampled_from(["1.0", "0.3", "2026-01-31T12:00:00Z", "2026-13-45T99:99:99Z", "aGk="]),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=10,
)
EVENT_OBJECTS = st.dictionaries(ATTRIBUTE_NAMES, VALUES, max_size=10)


def as_json(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:  # an integer orjson does not write: write the text by hand
        return str(value).encode()


BODIES = st.one_of(
    st.binary(max_size=200),
    EVENT_OBJECTS.map(as_json),
    st.lists(EVENT_OBJECTS, max_size=3).map(as_json),
    VALUES.map(as_json),
    st.integers(0, 2_000).map(lambda n: b"[" * n + b"]" * n),
)
HEADER_VALUES = st.one_of(
    st.text(max_size=30), st.sampled_from(["1.0", "%E2%82%AC", "%FF", "%", "a%20b"])
)
HEADERS = st.dictionaries(
    st.one_of(ATTRIBUTE_NAMES.map(lambda n: "ce-" + n.lower()), st.text(max_size=10)),
    HEADER_VALUES,
    max_size=8,
)


@FUZZ
@given(CONTENT_TYPES, HEADERS, BODIES)
def test_any_request_reads_as_events_or_is_refused(
    content_type: str | None, headers: dict[str, str], body: bytes
) -> None:
    try:
        mode, events = read_events(content_type, headers, body)
    except EventRefused as exc:
        refused = exc
    else:
        assert mode in ("structured", "batch", "binary")
        assert events or mode == "batch"  # an empty batch is a batch (the JSON format)
        assert all(isinstance(e, CloudEvent) for e in events)
        for event in events:
            assert event.id and event.source and event.type
            # a float that large comes from a float literal, never from an integer
            big = [v for v in _leaves(event.payload()) if type(v) is float and abs(v) >= 2.0**63]
            assert not big or _has_float_literal(body)
        return
    assert refused.status in (400, 415) and refused.problems and refused.detail


def _leaves(value: Any) -> list[Any]:
    stack, found = [value], []
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        else:
            found.append(item)
    return found


def _has_float_literal(body: bytes) -> bool:
    return any(c in body for c in (b".", b"e", b"E"))


@pytest.mark.parametrize("n", [2**70, -(2**70), 2**64])
def test_an_integer_past_64_bits_never_reads_as_a_float(n: int) -> None:
    body = b'{"specversion": "1.0", "id": "1", "source": "s", "type": "t", "data": [%d]}' % n
    _, (event,) = read_events(STRUCTURED, {}, body)
    assert event.data == [n] and type(event.data[0]) is int
    headers = {"ce-specversion": "1.0", "ce-id": "1", "ce-source": "s", "ce-type": "t"}
    _, (binary,) = read_events("application/json", headers, b"%d" % n)
    assert binary.data == n and type(binary.data) is int


AUTHORIZATION = st.one_of(
    st.none(),
    st.text(max_size=80),
    st.builds(
        lambda scheme, id_, secret: f"{scheme} tf_{id_}_{secret}",
        st.sampled_from(["Bearer", "bearer", "Basic", "", "Bearer  "]),
        st.text(alphabet="0123456789abcdef", max_size=18),
        st.text(alphabet="abcXYZ019_-=", max_size=45),
    ),
)


@pytest.fixture(scope="module")
def token_store() -> tuple[MemoryStore, str]:
    async def make() -> tuple[MemoryStore, str]:
        store = MemoryStore()
        await store.open()
        issued = await issue_token(store, name="fuzz", role=Role.VIEWER, now=0.0)
        return store, issued.value

    return asyncio.run(make())


@FUZZ
@given(AUTHORIZATION)
def test_any_authorization_header_is_a_principal_or_unauthenticated(
    token_store: tuple[MemoryStore, str], header: str | None
) -> None:
    store, _ = token_store
    parsed: tuple[str, str] | Unauthenticated
    try:
        parsed = parse_authorization(header)
    except Unauthenticated as exc:
        parsed = exc
    outcome: Principal | Unauthenticated
    try:
        outcome = asyncio.run(authenticate(store, header, now=1.0))
    except Unauthenticated as exc:
        outcome = exc
    if isinstance(parsed, Unauthenticated):  # a malformed header never gets in
        assert isinstance(outcome, Unauthenticated)
    else:
        assert (len(parsed[0]), len(parsed[1])) == (16, 43)


def test_the_live_token_authenticates(token_store: tuple[MemoryStore, str]) -> None:
    store, value = token_store
    principal = asyncio.run(authenticate(store, f"Bearer {value}", now=1.0))
    assert principal.name == "fuzz"


TRACE_TEXT = st.one_of(
    st.text(max_size=80),
    st.builds(
        lambda version, trace, span, flags: f"{version}-{trace}-{span}-{flags}",
        st.sampled_from(["00", "ff", "01", "0", "zz"]),
        st.text(alphabet="0123456789abcdefABCDEF", min_size=30, max_size=33),
        st.text(alphabet="0123456789abcdef", min_size=15, max_size=17),
        st.sampled_from(["00", "01", "ff", "1", ""]),
    ),
)


@pytest.fixture(scope="module")
def tracing() -> Tracing:
    return Tracing(TracerProvider())


@FUZZ
@given(TRACE_TEXT, st.text(max_size=80))
def test_any_traceparent_is_a_context_or_none_and_never_an_error(
    tracing: Tracing, traceparent: str, tracestate: str
) -> None:
    headers = {"traceparent": traceparent, "tracestate": tracestate}
    tracing.extract(headers)
    with tracing.joined(headers):
        pass
    link = tracing.link_to(headers, "t")
    assert link is None or link.context.is_valid
    tracing.run_context("r1", traceparent)
