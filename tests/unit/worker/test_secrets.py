"""Secret providers, marker resolution and redaction."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tideflow.model.events import ErrorInfo
from tideflow.model.secrets import secret_marker
from tideflow.worker.secrets import (
    ChainSecretProvider,
    EnvSecretProvider,
    FileSecretProvider,
    Redactor,
    SecretNotFound,
    SecretProvider,
    default_provider,
    parse_secrets_file,
    redact_fields,
    resolve_markers,
)


class DictProvider(SecretProvider):
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values
        self.lookups: list[str] = []

    def get(self, name: str) -> str | None:
        self.lookups.append(name)
        return self.values.get(name)

    def describe(self, name: str) -> str:
        return "a test dict"


def test_env_provider() -> None:
    provider = EnvSecretProvider({"TIDEFLOW_SECRET_API_KEY": "k-123", "TIDEFLOW_SECRET_EMPTY": ""})
    assert provider.get("API_KEY") == "k-123"
    assert provider.get("api_key") == "k-123"
    assert provider.get("EMPTY") == ""
    assert provider.get("OTHER") is None
    assert "TIDEFLOW_SECRET_OTHER" in provider.describe("OTHER")


def test_env_provider_reads_the_live_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDEFLOW_SECRET_LIVE", "now-set")
    assert EnvSecretProvider().get("LIVE") == "now-set"


def test_dotenv_file(tmp_path: Path) -> None:
    path = tmp_path / "secrets.env"
    path.write_text(
        "# comment\n\nexport DB_PASSWORD=s3cret=with=equals\nTOKEN = 'quoted value'\n"
        'MULTI="line\\none"\n'
    )
    provider = FileSecretProvider(path)
    assert provider.get("DB_PASSWORD") == "s3cret=with=equals"
    assert provider.get("TOKEN") == "quoted value"
    assert provider.get("MULTI") == "line\none"
    assert provider.get("NOPE") is None


def test_json_file_and_reload_on_change(tmp_path: Path) -> None:
    path = tmp_path / "secrets.json"
    path.write_text('{"API_KEY": "one", "PORT": 5432}')
    provider = FileSecretProvider(path)
    assert provider.get("API_KEY") == "one"
    assert provider.get("PORT") == "5432"
    path.write_text('{"API_KEY": "two-changed"}')
    os.utime(path, ns=(1, 1))  # a different stamp even within one clock tick
    assert provider.get("API_KEY") == "two-changed"


def test_missing_file_holds_no_secrets(tmp_path: Path) -> None:
    provider = FileSecretProvider(tmp_path / "absent.env")
    assert provider.get("X") is None
    assert "does not exist" in provider.describe("X")


def test_malformed_file_never_echoes_a_value() -> None:
    with pytest.raises(ValueError, match=r"f\.env:2: expected NAME=value") as caught:
        parse_secrets_file("A=1\nhunter2-without-name\n", "f.env")
    assert "hunter2" not in str(caught.value)


def test_chain_and_default_provider(tmp_path: Path) -> None:
    path = tmp_path / "s.env"
    path.write_text("FROM_FILE=file-value\nBOTH=file-loses\n")
    environ = {
        "TIDEFLOW_SECRET_BOTH": "env-wins",
        "TIDEFLOW_SECRETS_FILE": str(path),
    }
    provider = default_provider(environ)
    assert provider.get("BOTH") == "env-wins"
    assert provider.get("FROM_FILE") == "file-value"
    assert provider.get("NONE") is None
    where = provider.describe("NONE")
    assert "TIDEFLOW_SECRET_NONE" in where and str(path) in where
    chain = ChainSecretProvider([DictProvider({}), DictProvider({"A": "x"})])
    assert chain.get("A") == "x"


def test_resolve_markers_in_nested_values() -> None:
    provider = DictProvider({"TOKEN": "tok-value", "USER": "alice-user"})
    value = {
        "headers": {"Authorization": f"Bearer {secret_marker('TOKEN')}"},
        "list": [secret_marker("USER"), 3, None, {"deep": secret_marker("TOKEN")}],
        secret_marker("USER"): "key too",
    }
    resolved, used = resolve_markers(value, ["TOKEN", "USER"], provider)
    assert resolved == {
        "headers": {"Authorization": "Bearer tok-value"},
        "list": ["alice-user", 3, None, {"deep": "tok-value"}],
        "alice-user": "key too",
    }
    assert sorted(used) == ["alice-user", "tok-value"]
    assert provider.lookups.count("TOKEN") == 1


def test_only_allowed_names_are_resolved() -> None:
    provider = DictProvider({"TOKEN": "tok-value", "OTHER": "other-value"})
    text = f"{secret_marker('TOKEN')}/{secret_marker('OTHER')}"
    resolved, used = resolve_markers(text, ["TOKEN"], provider)
    assert resolved == f"tok-value/{secret_marker('OTHER')}"
    assert used == ["tok-value"]
    assert "OTHER" not in provider.lookups
    assert resolve_markers(text, [], provider) == (text, [])


def test_missing_secret() -> None:
    with pytest.raises(SecretNotFound) as caught:
        resolve_markers({"k": secret_marker("DB_PASSWORD")}, ["DB_PASSWORD"], DictProvider({}))
    assert not caught.value.retryable
    assert "'DB_PASSWORD'" in caught.value.message
    assert "a test dict" in caught.value.message


def test_redactor_masks_values_everywhere() -> None:
    redactor = Redactor(["tok-value", "abc"])  # "abc" is too short to mask
    obj = {
        "out": "got tok-value back",
        "nested": [{"tok-value": "tok-value!"}, 42, None],
        "short": "abc stays",
    }
    assert redactor.redact(obj) == {
        "out": "got *** back",
        "nested": [{"***": "***!"}, 42, None],
        "short": "abc stays",
    }
    assert bool(redactor)
    assert not Redactor(["abc"])


def test_redactor_masks_encoded_forms_and_longest_first() -> None:
    redactor = Redactor(['p@ss w/"q"', "secret", "secret-longer"])
    assert redactor.redact_text("a=p%40ss%20w%2F%22q%22") == "a=***"
    assert redactor.redact_text("b=p%40ss+w%2F%22q%22") == "b=***"
    assert redactor.redact_text('{"pw": "p@ss w/\\"q\\""}') == '{"pw": "***"}'
    assert redactor.redact_text("secret-longer and secret") == "*** and ***"


def test_redact_error() -> None:
    error = ErrorInfo(type="HttpClientError", message="GET /?k=hunter22 failed", details="hunter22")
    redacted = Redactor(["hunter22"]).redact_error(error)
    assert redacted.message == "GET /?k=*** failed"
    assert redacted.details == "***"
    assert redacted.type == "HttpClientError"


def test_redact_fields() -> None:
    obj = {
        "card_number": "4111",
        "customer": {"name": "Ann", "card_number": "4222", "address": {"zip": "1000"}},
        "items": [{"sku": "a", "price": 1}, {"sku": "b", "price": 2}],
    }
    out = redact_fields(obj, ["card_number", "customer.address", "items.price"])
    assert out == {
        "card_number": "***",
        "customer": {"name": "Ann", "card_number": "***", "address": "***"},
        "items": [{"sku": "a", "price": "***"}, {"sku": "b", "price": "***"}],
    }
    assert obj["card_number"] == "4111"  # the original is untouched
    assert redact_fields(obj, []) is obj
