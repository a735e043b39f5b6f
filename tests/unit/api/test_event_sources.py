"""The gateway's sources configuration: loading it (YAML or JSON), each mistake a clear
error, and which rule a source falls under."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tideflow.api.event_sources import (
    DEFAULT_REPLAY_WINDOW,
    EventRequest,
    EventSources,
    EventSourcesError,
    SourceRefused,
    sign,
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
