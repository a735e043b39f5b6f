"""Secret values for steps, and keeping them (and sensitive fields) out of everything recorded.

The core renders ``secrets.NAME`` as a marker (see ``tideflow.model.secrets``).
Just before an executor runs, the worker calls :func:`resolve_markers` with the
names the step's templates reference (``DispatchTask.secrets``) and a
:class:`SecretProvider`; the values it used feed a :class:`Redactor` that masks
them in the step's output, error, and log lines before anything is stored.
Fields a definition marks ``sensitive`` are masked with :func:`redact_fields` (the one
set of rules: ``tideflow.model.masking``).

Providers: :class:`EnvSecretProvider` (``TIDEFLOW_SECRET_<NAME>``),
:class:`FileSecretProvider` (a JSON object or ``.env`` file of ``NAME=value``),
:class:`ChainSecretProvider` (first that has it). :func:`default_provider` is the
environment, then the file named by ``TIDEFLOW_SECRETS_FILE`` if set.
"""

from __future__ import annotations

import os
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import orjson

from tideflow.model.events import ErrorInfo
from tideflow.model.masking import PLACEHOLDER, mask
from tideflow.model.secrets import MARKER_PREFIX, MARKER_RE
from tideflow.worker.executors.errors import SecretNotFound

__all__ = [
    "ChainSecretProvider",
    "EnvSecretProvider",
    "FileSecretProvider",
    "Redactor",
    "SecretNotFound",
    "SecretProvider",
    "default_provider",
    "redact_fields",
    "resolve_markers",
]

ENV_PREFIX = "TIDEFLOW_SECRET_"
SECRETS_FILE_VARIABLE = "TIDEFLOW_SECRETS_FILE"
MIN_REDACTED_LENGTH = 4


class SecretProvider(ABC):
    """Where secret values come from."""

    @abstractmethod
    def get(self, name: str) -> str | None:
        """The value of secret ``name``, or None when this provider does not have it."""

    def describe(self, name: str) -> str:
        """Where this provider looked for ``name`` (for error messages; never a value)."""
        return type(self).__name__


class EnvSecretProvider(SecretProvider):
    """Secrets from environment variables ``TIDEFLOW_SECRET_<NAME>``.

    ``NAME`` is tried as written, then upper-cased.
    """

    def __init__(self, environ: Mapping[str, str] | None = None, prefix: str = ENV_PREFIX) -> None:
        self._environ = environ
        self._prefix = prefix

    def get(self, name: str) -> str | None:
        environ = os.environ if self._environ is None else self._environ
        for variable in self._variables(name):
            if variable in environ:
                return environ[variable]
        return None

    def describe(self, name: str) -> str:
        return "environment variable " + " or ".join(self._variables(name))

    def _variables(self, name: str) -> list[str]:
        names = [self._prefix + name]
        if name.upper() != name:
            names.append(self._prefix + name.upper())
        return names


class FileSecretProvider(SecretProvider):
    """Secrets from a file: a JSON object, or ``.env`` lines ``NAME=value``.

    ``.env`` lines may start with ``export``; ``#`` starts a comment line; values may be
    quoted. The file is re-read when it changes. A missing file holds no secrets.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._values: dict[str, str] = {}

    def get(self, name: str) -> str | None:
        return self._load().get(name)

    def describe(self, name: str) -> str:
        state = "" if self._path.is_file() else " (the file does not exist)"
        return f"secrets file {self._path}{state}"

    def _load(self) -> dict[str, str]:
        try:
            stat = self._path.stat()
        except FileNotFoundError:
            return {}
        with self._lock:
            stamp = (stat.st_mtime_ns, stat.st_size)
            if stamp != self._stamp:
                self._values = parse_secrets_file(
                    self._path.read_text(encoding="utf-8"), self._path
                )
                self._stamp = stamp
            return self._values


class ChainSecretProvider(SecretProvider):
    """The first of several providers that has the secret."""

    def __init__(self, providers: Iterable[SecretProvider]) -> None:
        self._providers = list(providers)

    def get(self, name: str) -> str | None:
        for provider in self._providers:
            value = provider.get(name)
            if value is not None:
                return value
        return None

    def describe(self, name: str) -> str:
        return ", then ".join(p.describe(name) for p in self._providers) or "no providers"


def default_provider(environ: Mapping[str, str] | None = None) -> SecretProvider:
    """The environment, then the file named by ``TIDEFLOW_SECRETS_FILE`` when set."""
    env = os.environ if environ is None else environ
    providers: list[SecretProvider] = [EnvSecretProvider(environ)]
    if env.get(SECRETS_FILE_VARIABLE):
        providers.append(FileSecretProvider(env[SECRETS_FILE_VARIABLE]))
    return ChainSecretProvider(providers)


def parse_secrets_file(text: str, path: str | os.PathLike[str] = "<secrets>") -> dict[str, str]:
    """``NAME → value`` from the text of a JSON or ``.env`` secrets file."""
    if text.lstrip().startswith("{"):
        return _parse_json_secrets(text, path)
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.removeprefix("export ").partition("=")
        if not sep or not name.strip():
            # Never echo the line: it may hold a value.
            raise ValueError(f"{path}:{number}: expected NAME=value")
        values[name.strip()] = _unquote(value.strip())
    return values


def _parse_json_secrets(text: str, path: str | os.PathLike[str]) -> dict[str, str]:
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise ValueError(f"{path}: not valid JSON") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of NAME: value")
    values: dict[str, str] = {}
    for name, value in data.items():
        if isinstance(value, dict | list):
            raise ValueError(f"{path}: secret {name!r} must be a string")
        if value is not None:
            values[name] = value if isinstance(value, str) else orjson.dumps(value).decode()
    return values


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        inner = value[1:-1]
        if value[0] == '"':
            inner = inner.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")
        return inner
    return value


def resolve_markers(
    value: Any, allowed: Iterable[str], provider: SecretProvider
) -> tuple[Any, list[str]]:
    """Replace secret markers with values, for the names in ``allowed`` only.

    Returns the new value and the secret values used (for a :class:`Redactor`).
    Markers of other names are left as they are. A missing secret raises
    ``SecretNotFound`` naming where it was looked for.
    """
    names = frozenset(allowed)
    if not names:
        return value, []
    used: dict[str, str] = {}

    def lookup(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in names:
            return match.group(0)
        if name not in used:
            secret = provider.get(name)
            if secret is None:
                raise SecretNotFound(
                    f"secret {name!r} has no value: looked in {provider.describe(name)}"
                )
            used[name] = secret
        return used[name]

    def substitute(text: str) -> str:
        return MARKER_RE.sub(lookup, text) if MARKER_PREFIX in text else text

    return _map_strings(value, substitute), list(used.values())


class Redactor:
    """Masks known secret values wherever they occur in strings of a nested value.

    Values shorter than 4 characters are not masked (they would mask innocent
    text). Their URL-encoded and JSON-escaped forms are masked too.
    """

    def __init__(self, values: Iterable[str], placeholder: str = PLACEHOLDER) -> None:
        self._values = sorted({v for v in values if len(v) >= MIN_REDACTED_LENGTH})
        forms = {form for v in self._values for form in _encoded_forms(v)}
        ordered = sorted(forms, key=len, reverse=True)  # longest first: no partial masking
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None
        self._placeholder = placeholder

    def __bool__(self) -> bool:
        return self._pattern is not None

    def extend(self, values: Iterable[str]) -> Redactor:
        """A redactor for these values as well as this one's."""
        return Redactor([*self._values, *values], self._placeholder)

    def redact(self, obj: Any) -> Any:
        """``obj`` with every occurrence of a secret value replaced by the placeholder."""
        if self._pattern is None:
            return obj
        return _map_strings(obj, self.redact_text)

    def redact_text(self, text: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(self._placeholder, text)

    def redact_error(self, error: ErrorInfo) -> ErrorInfo:
        """``error`` with its message and details redacted."""
        if self._pattern is None:
            return error
        details = None if error.details is None else self.redact_text(error.details)
        return replace(error, message=self.redact_text(error.message), details=details)


def _encoded_forms(value: str) -> set[str]:
    return {value, quote(value, safe=""), quote_plus(value), orjson.dumps(value).decode()[1:-1]}


def redact_fields(obj: Any, field_names: Iterable[str], placeholder: str = PLACEHOLDER) -> Any:
    """``obj`` as a person may see it: the values of the named fields, and of keys that
    name a credential, replaced by the placeholder (``tideflow.model.masking.mask``).

    A plain name (``card_number``) matches that key at any depth; a dotted name
    (``payment.card.number``) matches that path from the top, lists being
    transparent (``items.secret`` matches the key in every item of ``items``).
    """
    return mask(obj, field_names, placeholder=placeholder)


def _map_strings(obj: Any, fn: Callable[[str], str]) -> Any:
    """``obj`` with ``fn`` applied to every string in it, mapping keys included."""
    if isinstance(obj, str):
        return fn(obj)
    if isinstance(obj, Mapping):
        return {_map_key(k, fn): _map_strings(v, fn) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_map_strings(item, fn) for item in obj]
    return obj


def _map_key(key: Any, fn: Callable[[str], str]) -> Any:
    return fn(key) if isinstance(key, str) else key
