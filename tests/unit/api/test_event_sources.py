"""The gateway's sources configuration: loading it (YAML or JSON), each mistake a clear
error, and which rule a source falls under."""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import pytest

from tideflow.api.event_signatures import canonical_request
from tideflow.api.event_sources import (
    DEFAULT_REPLAY_WINDOW,
    EventRequest,
    EventSources,
    EventSourcesError,
    SourceRefused,
    sign,
    sign_v2,
)

ENV = {"A_TOKEN": "a-token-0123456789abcdef", "A_SECRET": "a-secret-0123456789abcdef"}


def sources(*entries: dict[str, Any]) -> EventSources:
    """The sources of ``entries``, each allowed any type unless it says."""
    return EventSources.of({"sources": [{"types": ["*"], **e} for e in entries]}, ENV)


def test_a_yaml_and_a_json_file_load_alike(tmp_path: Path) -> None:
    yaml_file = tmp_path / "sources.yaml"
    yaml_file.write_text(
        "sources:\n"
        "  - {source: 'https://pay.example/hooks', auth: hmac, secret_env: A_SECRET, replay_window: 60, types: ['pay.*']}\n"
        "  - {source: 'urn:desk:*', auth: bearer, token_env: A_TOKEN, types: [desk.approved], address_runs: true}\n"
    )
    json_file = tmp_path / "sources.json"
    json_file.write_text(
        json.dumps(
            {
                "sources": [
                    {
                        "source": "https://pay.example/hooks",
                        "auth": "hmac",
                        "secret_env": "A_SECRET",
                        "replay_window": 60,
                        "types": ["pay.*"],
                    },
                    {
                        "source": "urn:desk:*",
                        "auth": "bearer",
                        "token_env": "A_TOKEN",
                        "types": ["desk.approved"],
                        "address_runs": True,
                    },
                ]
            }
        )
    )
    loaded = [EventSources.load(f, ENV) for f in (yaml_file, json_file)]
    assert loaded[0] == loaded[1]
    (pay, desk) = loaded[0].rules
    assert (pay.auth, pay.secret, pay.replay_window) == ("hmac", ENV["A_SECRET"], 60.0)
    assert (desk.auth, desk.replay_window) == ("bearer", DEFAULT_REPLAY_WINDOW)
    assert (pay.types, pay.address_runs) == (("pay.*",), False)
    assert (desk.types, desk.address_runs) == (("desk.approved",), True)
    assert ENV["A_SECRET"] not in repr(pay)


def test_an_exact_source_wins_over_a_prefix_and_the_longest_prefix_over_others() -> None:
    rules = sources(
        {"source": "urn:a:*", "auth": "bearer", "token_env": "A_TOKEN"},
        {"source": "urn:a:b:*", "auth": "bearer", "token_env": "A_TOKEN"},
        {"source": "urn:a:b:c", "auth": "hmac", "secret_env": "A_SECRET"},
    )
    assert rules.rule_for("urn:a:b:c").pattern == "urn:a:b:c"  # type: ignore[union-attr]
    assert rules.rule_for("urn:a:b:cd").pattern == "urn:a:b:*"  # type: ignore[union-attr]
    assert rules.rule_for("urn:a:x").pattern == "urn:a:*"  # type: ignore[union-attr]
    assert rules.rule_for("urn:b") is None
    assert rules.rule_for("urn:a") is None  # the prefix is "urn:a:"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "one key, `sources`"),
        ({"sources": {}}, "`sources` is a list"),
        ({"sources": ["x"]}, "sources[0]: a source is a mapping"),
        (
            {"sources": [{"source": "s", "auth": "basic"}]},
            "auth is 'basic': give `bearer` or `hmac`",
        ),
        ({"sources": [{"source": "s", "auth": "bearer"}]}, "auth bearer needs token_env"),
        (
            {"sources": [{"source": "s", "auth": "bearer", "token": "inline"}]},
            "unknown key 'token' for auth bearer",
        ),
        (
            {"sources": [{"source": "s", "auth": "bearer", "token_env": "UNSET"}]},
            "the environment variable UNSET (token_env) is not set",
        ),
        (
            {"sources": [{"source": "s", "auth": "bearer", "token_env": "SHORT"}]},
            "use at least 16",
        ),
        (
            {"sources": [{"source": "s", "auth": "bearer", "token_env": "API_LIKE"}]},
            "marks an API token",
        ),
        (
            {"sources": [{"source": "a*b", "auth": "bearer", "token_env": "A_TOKEN"}]},
            "`*` may only end a pattern",
        ),
        ({"sources": [{"source": "", "auth": "bearer", "token_env": "A_TOKEN"}]}, "source is"),
        (
            {
                "sources": [
                    {"source": "s", "auth": "hmac", "secret_env": "A_SECRET", "replay_window": 0}
                ]
            },
            "replay_window is seconds",
        ),
        (
            {
                "sources": [
                    {"source": "s", "auth": "bearer", "token_env": "A_TOKEN", "types": ["*"]},
                    {"source": "s", "auth": "hmac", "secret_env": "A_SECRET", "types": ["*"]},
                ]
            },
            "sources[1]: source 's' is listed already, at sources[0]",
        ),
    ],
)
def test_each_mistake_is_named(data: Any, message: str) -> None:
    env = {**ENV, "SHORT": "short", "API_LIKE": "tf_0123456789abcdef_x"}
    with pytest.raises(EventSourcesError) as caught:
        EventSources.of(data, env, where="sources.yaml")
    assert message in str(caught.value)
    assert str(caught.value).startswith("sources.yaml: ")


def test_an_unreadable_or_malformed_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(EventSourcesError, match="cannot read the event sources"):
        EventSources.load(tmp_path / "missing.yaml", ENV)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(EventSourcesError, match=r"broken.json: not valid JSON"):
        EventSources.load(broken, ENV)


def structured(headers: dict[str, str], body: bytes) -> EventRequest:
    return EventRequest.of("POST", "/events", headers.items(), body, self_contained=True)


def test_a_signature_is_checked_against_the_body_and_the_time() -> None:
    (rule,) = sources({"source": "s", "auth": "hmac", "secret_env": "A_SECRET"}).rules
    body = b'{"id": "1"}'
    good = {
        "x-tideflow-timestamp": "1000",
        "x-tideflow-signature": sign(ENV["A_SECRET"], "1000", body),
    }
    rule.check(structured(good, body), now=1000 + 300)
    rule.check(structured(good, body), now=1000 - 300)
    for now in (1000 + 301, 1000 - 301):
        with pytest.raises(SourceRefused, match="replay window"):
            rule.check(structured(good, body), now=now)
    with pytest.raises(SourceRefused, match="bad signature"):
        rule.check(structured(good, body + b" "), now=1000)
    upper = {**good, "x-tideflow-signature": good["x-tideflow-signature"].upper()}
    rule.check(structured(upper, body), now=1000)  # hex digits (and the scheme) in either case
    for missing in ("x-tideflow-timestamp", "x-tideflow-signature"):
        with pytest.raises(SourceRefused, match="no signature or no timestamp"):
            rule.check(structured({k: v for k, v in good.items() if k != missing}, body), now=1000)


def test_the_signature_is_hmac_sha256_of_timestamp_dot_body() -> None:
    import hashlib
    import hmac

    expected = hmac.new(b"k" * 16, b"1700000000.{}", hashlib.sha256).hexdigest()
    assert sign("k" * 16, "1700000000", b"{}") == f"sha256={expected}"


BEARER = {"source": "s", "auth": "bearer", "token_env": "A_TOKEN"}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({}, "give `types`, the event types this source may send"),
        ({"types": []}, "types is a list of event types"),
        ({"types": "pay.*"}, "types is a list of event types"),
        ({"types": ["pay.*.x"]}, "types[0] 'pay.*.x': `*` may only end a pattern"),
        ({"types": ["a", ""]}, "types[1]: '' is not an event type"),
        ({"types": [7]}, "types[0]: 7 is not an event type"),
        ({"types": ["*"], "address_runs": "yes"}, "address_runs is true or false"),
        ({"types": ["*"], "allowed_types": ["a"]}, "unknown key 'allowed_types'"),
        ({"types": ["*"], "previous_secret_env": "A_SECRET"}, "unknown key 'previous_secret_env' for auth bearer"),
        ({"types": ["*"], "previous_token_env": "UNSET"}, "the environment variable UNSET (previous_token_env) is not set"),
        ({"types": ["*"], "previous_token_env": "SHORT"}, "use at least 16"),
    ],
)  # fmt: skip
def test_each_policy_and_rotation_mistake_is_named(changes: dict[str, Any], message: str) -> None:
    env = {**ENV, "SHORT": "short"}
    with pytest.raises(EventSourcesError) as caught:
        EventSources.of({"sources": [{**BEARER, **changes}]}, env, where="sources.yaml")
    assert message in str(caught.value)
    assert str(caught.value).startswith("sources.yaml: sources[0]: ")


def test_a_policy_allows_the_types_of_its_patterns_and_runs_only_if_it_says() -> None:
    (rule,) = sources({**BEARER, "types": ["pay.*", "desk.approved"]}).rules
    assert rule.not_allowed("pay.succeeded", names_a_run=False) == []
    assert rule.not_allowed("pay.", names_a_run=False) == []
    assert rule.not_allowed("desk.approved", names_a_run=False) == []
    assert [f for f, _ in rule.not_allowed("desk.approved.late", names_a_run=False)] == ["type"]
    assert [f for f, _ in rule.not_allowed("payment", names_a_run=True)] == [
        "type",
        "tideflowrunid",
    ]
    (anything,) = sources({**BEARER, "types": ["*"], "address_runs": True}).rules
    assert anything.not_allowed("whatever", names_a_run=True) == []


def test_two_secrets_are_valid_while_one_is_rotated() -> None:
    env = {**ENV, "OLD": "an-old-secret-0123456789"}
    entry = {"source": "s", "auth": "hmac", "secret_env": "A_SECRET", "types": ["*"]}
    (rule,) = EventSources.of({"sources": [{**entry, "previous_secret_env": "OLD"}]}, env).rules
    assert rule.secrets == (ENV["A_SECRET"], env["OLD"])
    body = b'{"id": "1"}'
    for secret in (ENV["A_SECRET"], env["OLD"]):
        headers = {
            "x-tideflow-timestamp": "1000",
            "x-tideflow-signature": sign(secret, "1000", body),
        }
        rule.check(structured(headers, body), now=1000)
    third = {"x-tideflow-timestamp": "1000", "x-tideflow-signature": sign("x" * 16, "1000", body)}
    with pytest.raises(SourceRefused, match="bad signature"):
        rule.check(structured(third, body), now=1000)


def test_the_v2_canonical_request_is_the_documented_one() -> None:
    headers = [
        ("Content-Type", "application/json"),
        ("ce-type", "pay.succeeded"),
        ("CE-ID", " p-1 "),
        ("ce-source", "urn:pay"),
        ("authorization", "Bearer x"),
        ("ce-specversion", "1.0"),
    ]
    digest = hashlib.sha256(b"{}").hexdigest()
    assert (
        canonical_request("1700000000", "post", "/events", headers, b"{}")
        == (
            "tideflow-v2\n1700000000\nPOST\n/events\napplication/json\n"
            "ce-id:p-1\nce-source:urn:pay\nce-specversion:1.0\nce-type:pay.succeeded\n"
            f"{digest}"
        ).encode()
    )
    expected = hmac.new(
        b"k" * 16, canonical_request("1", "POST", "/events", headers, b"{}"), hashlib.sha256
    )
    assert sign_v2("k" * 16, "1", "POST", "/events", headers, b"{}") == "v2=" + expected.hexdigest()


def test_a_binary_request_needs_v2_and_says_so_in_the_log() -> None:
    (rule,) = sources({"source": "s", "auth": "hmac", "secret_env": "A_SECRET"}).rules
    body = b'{"id": "1"}'
    headers = {
        "x-tideflow-timestamp": "1000",
        "x-tideflow-signature": sign(ENV["A_SECRET"], "1000", body),
    }
    as_binary = EventRequest.of("POST", "/events", headers.items(), body, self_contained=False)
    with pytest.raises(SourceRefused, match="sign the request with v2="):
        rule.check(as_binary, now=1000)
