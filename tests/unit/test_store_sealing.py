"""The sealing of sensitive values (``tideflow.store.sealing``) without a database:
keys as the environment gives them, tokens, and which keys of a value are sealed."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from tideflow.dsl import compile_definition
from tideflow.errors import StateFormatError, StoreError, UnstorableData
from tideflow.model.events import RunStarted
from tideflow.model.plan import Plan
from tideflow.model.run import new_run_state
from tideflow.store import sqlbase as sb
from tideflow.store.base import AppliedEvent
from tideflow.store.sealing import (
    KEY_VARIABLE,
    OLD_KEYS_VARIABLE,
    SEALED_PREFIX,
    DataKey,
    Keyring,
    Sealer,
    SensitiveNames,
)

SECRET = bytes(range(32))
STANDARD = base64.b64encode(SECRET).decode()  # has '+' or '/' for some bytes
URLSAFE = base64.urlsafe_b64encode(SECRET).decode().rstrip("=")


@pytest.mark.parametrize("text", [f"k1:{STANDARD}", f"k1:{URLSAFE}", f"  k1:{STANDARD}\n"])
def test_a_key_is_an_id_and_32_bytes_of_base64_in_either_alphabet(text: str) -> None:
    assert DataKey.parse(text, KEY_VARIABLE) == DataKey("k1", SECRET)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (STANDARD, "expected <id>:<base64 key>"),
        (f"bad id:{STANDARD}", "expected <id>:<base64 key>"),
        ("k1:not base64!", "is not base64"),
        (f"k1:{base64.b64encode(b'short').decode()}", "is 5 bytes, AES-256 needs 32"),
    ],
)
def test_a_malformed_key_is_refused_without_echoing_it(text: str, says: str) -> None:
    with pytest.raises(StoreError, match=says) as caught:
        DataKey.parse(text, KEY_VARIABLE)
    assert KEY_VARIABLE in caught.value.message and "openssl rand" in caught.value.message
    assert STANDARD not in caught.value.message


def test_the_environment_gives_the_current_key_and_the_old_ones() -> None:
    old = DataKey("k1", b"\x01" * 32)
    ring = Keyring.from_environment(
        {KEY_VARIABLE: f"k2:{STANDARD}", OLD_KEYS_VARIABLE: f"{old.text()}, "}
    )
    assert ring.current == DataKey("k2", SECRET)
    assert ring.ids() == ["k1", "k2"]
    sealed_by_old = Keyring(old).seal({"n": 1})
    assert ring.open(sealed_by_old) == {"n": 1}
    assert ring.seal("x").startswith(f"{SEALED_PREFIX}k2:")


def test_two_keys_with_one_id_are_refused() -> None:
    with pytest.raises(StoreError, match="two different keys have the id 'k1'"):
        Keyring(DataKey("k1", SECRET), [DataKey("k1", b"\x00" * 32)])


def test_a_token_is_random_and_bound_to_its_key_id() -> None:
    ring = Keyring(DataKey("k1", SECRET), [DataKey("k2", SECRET)])
    first, second = ring.seal("4111"), ring.seal("4111")
    assert first != second and "4111" not in first
    assert ring.open(first) == "4111"
    relabelled = first.replace(f"{SEALED_PREFIX}k1:", f"{SEALED_PREFIX}k2:")
    with pytest.raises(StateFormatError, match="encrypted with key 'k2' does not decrypt"):
        ring.open(relabelled)  # same bytes, other id: the id is authenticated
    with pytest.raises(StateFormatError, match="does not decrypt"):
        ring.open(first[:-4] + "AAAA")


def test_no_current_key_seals_nothing() -> None:
    with pytest.raises(UnstorableData):
        Keyring(None).seal("x")


def test_plain_names_match_at_any_depth_and_dotted_ones_by_the_end_of_the_path() -> None:
    names = SensitiveNames.of(["card", "customer.address"])
    assert names is not None
    sealer = Sealer(where="test", ephemeral=True, environ={})
    data = {
        "input": {"card": "4111", "customer": {"address": "Main St", "name": "Ann"}},
        "steps": [{"output": {"card": None, "address": "kept"}}],
    }
    sealed = sealer.seal(data, names, "run r")
    assert sealed["input"]["card"].startswith(SEALED_PREFIX)
    assert sealed["input"]["customer"]["address"].startswith(SEALED_PREFIX)
    assert sealed["input"]["customer"]["name"] == "Ann"
    assert sealed["steps"][0]["output"] == {"card": None, "address": "kept"}
    import orjson

    assert sealer.loads(orjson.dumps(sealed).decode(), "row") == data
    assert SensitiveNames.of([]) is None


def test_a_store_without_a_key_says_how_to_make_one() -> None:
    sealer = Sealer(where="the PostgreSQL store at db/x", environ={})
    names = SensitiveNames.of(["card"])
    assert names is not None
    with pytest.raises(UnstorableData, match=rf"set {KEY_VARIABLE} .*openssl rand -base64 32"):
        sealer.seal({"card": "4111"}, names, "run r")
    assert sealer.seal({"other": 1}, names, "run r") == {"other": 1}  # nothing to seal
    with pytest.raises(UnstorableData):  # a new run: refused even before a value comes
        sealer.seal({"other": 1}, names, "run r", eager=True)


def _plan(name: str, sensitive: list[str]) -> Plan:
    step: dict[str, Any] = {"id": "a", "type": "noop"}
    if sensitive:
        step["sensitive"] = sensitive
    return compile_definition({"name": name, "version": "1", "steps": [step]})


def _applied(run_id: str, plan: Plan, output: Any) -> AppliedEvent:
    state = new_run_state(
        run_id=run_id, workflow=plan.name, version="1", plan_hash=plan.hash, created_at=0.0
    )
    state.output = output
    event = RunStarted(event_id=f"{run_id}-start", run_id=run_id, time=1.0)
    return AppliedEvent(event=event, state=state, transitions=[], commands=[], seq=1)


def test_a_commit_seals_only_when_a_plan_of_its_runs_declares_sensitive_names() -> None:
    plain, vault = _plan("plain", []), _plan("vault", ["card"])
    sealer = Sealer(where="test", ephemeral=True, environ={})
    assert not sealer.knows_all({plain.hash})
    sealer.learn(plain)
    assert sealer.knows_all({plain.hash}) and not sealer.knows_all({plain.hash, vault.hash})
    sealer.learn(vault)
    assert sealer.for_plans({plain.hash}) is None  # its rows are written with no sealer
    assert sealer.for_plans({plain.hash, vault.hash}) is sealer

    batch = [_applied("p", plain, {"card": "4111"}), _applied("v", vault, {"card": "4111"})]
    rows = sb.batch_rows(batch, sealer.for_plans({plain.hash, vault.hash}))
    outputs = {run.run_id: run.output for run in rows.runs}
    assert outputs["p"] == '{"card":"4111"}'  # a plan that declares none: as it is
    assert outputs["v"] is not None and "4111" not in outputs["v"]
    assert sealer.loads(outputs["v"], "row") == {"card": "4111"}
