"""Fields a definition declares ``sensitive``, encrypted in every row a SQL store writes.

A run's *sensitive names* are the field names the steps of its plan list under
``sensitive`` (:func:`sensitive_names`). Wherever such a key occurs in what the store
writes for the run -- its state snapshot, its history events, its output column, its
outbox commands -- the value is replaced by a *sealed token*: the value's JSON
encrypted with AES-256-GCM, carried in a string ``tideflow:sealed:1:<key id>:<base64
of nonce + ciphertext>``. The key id is the additional authenticated data, so a token
cannot be passed off as sealed under another key. Rows are read back through
:meth:`Sealer.loads`, which opens every token, so the engine, the worker and the
clients see plain values; a text with no token (every run without sensitive names) is
parsed as it was, after one substring search.

Keys (:class:`Keyring`): ``TIDEFLOW_STORE_KEY`` holds the current key as
``<id>:<base64 of 32 bytes>`` (``echo "k1:$(openssl rand -base64 32)"``) and seals
everything new; ``TIDEFLOW_STORE_OLD_KEYS`` (comma separated, same form) still open what
older keys sealed. Without ``TIDEFLOW_STORE_KEY`` a SQLite file store uses a key file
beside the database (``<file>.key``, mode 0600, made on the first sensitive value), and
a PostgreSQL store refuses to store a sensitive value (``UnstorableData`` saying how to
make a key). Not a ``TIDEFLOW_SECRET_*`` name on purpose: those are the values
``{{ secrets.NAME }}`` may read, and a workflow must never read the store's key.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import logging
import os
import re
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from tideflow.errors import StateFormatError, StoreError, UnstorableData

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from tideflow.model.plan import Plan

__all__ = [
    "KEY_VARIABLE",
    "OLD_KEYS_VARIABLE",
    "SEALED_PREFIX",
    "DataKey",
    "Keyring",
    "Sealer",
    "SensitiveNames",
    "generate_key",
    "sensitive_names",
]

KEY_VARIABLE = "TIDEFLOW_STORE_KEY"
OLD_KEYS_VARIABLE = "TIDEFLOW_STORE_OLD_KEYS"
SEALED_PREFIX = "tideflow:sealed:1:"
KEY_BYTES = 32
NONCE_BYTES = 12
_KEY_ID = re.compile(r"[A-Za-z0-9_.-]{1,40}")
_MAKE_ONE = 'make one with: echo "k1:$(openssl rand -base64 32)"'
_log = logging.getLogger("tideflow.store")


# -- names -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SensitiveNames:
    """Plain names match a key at any depth; a dotted name (``card.number``) matches
    where the path of keys above a value ends with it (lists are transparent), so it
    holds wherever a step's value is kept: in a snapshot, an event or a command."""

    plain: frozenset[str]
    dotted: Mapping[str, tuple[tuple[str, ...], ...]]
    """Last segment -> the segments before it, for each dotted name."""

    @classmethod
    def of(cls, names: Iterable[str]) -> SensitiveNames | None:
        plain: set[str] = set()
        dotted: dict[str, list[tuple[str, ...]]] = {}
        for name in names:
            *above, last = name.split(".")
            if above:
                dotted.setdefault(last, []).append(tuple(above))
            else:
                plain.add(last)
        if not plain and not dotted:
            return None
        return cls(frozenset(plain), {k: tuple(v) for k, v in dotted.items()})

    def matches(self, key: str, path: tuple[str, ...]) -> bool:
        if key in self.plain:
            return True
        return any(path[len(path) - len(above) :] == above for above in self.dotted.get(key, ()))


def sensitive_names(plan: Plan) -> SensitiveNames | None:
    """The names every step of ``plan`` declares ``sensitive``, together: a run keeps a
    step's values in its input, its output and the inputs of later steps, so a name
    declared on one step is sealed wherever it occurs in the run."""
    return SensitiveNames.of(name for spec in plan.specs.values() for name in spec.sensitive)


# -- keys ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DataKey:
    key_id: str
    secret: bytes

    def __repr__(self) -> str:  # never the secret
        return f"DataKey({self.key_id!r})"

    def text(self) -> str:
        return f"{self.key_id}:{base64.b64encode(self.secret).decode()}"

    @classmethod
    def parse(cls, text: str, where: str) -> DataKey:
        """A key written ``<id>:<base64 of 32 bytes>``; a clear ``StoreError`` naming
        ``where`` otherwise (never echoing the text: it is a secret)."""
        key_id, sep, encoded = text.strip().partition(":")
        if not sep or not _KEY_ID.fullmatch(key_id):
            raise StoreError(
                f"{where}: expected <id>:<base64 key>, the id of 1-40 letters, digits, '.', "
                f"'_' or '-'; {_MAKE_ONE}"
            )
        standard = encoded.replace("-", "+").replace("_", "/")  # either alphabet
        try:
            secret = base64.b64decode(standard + "=" * (-len(standard) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise StoreError(f"{where}: key {key_id!r} is not base64; {_MAKE_ONE}") from None
        if len(secret) != KEY_BYTES:
            raise StoreError(
                f"{where}: key {key_id!r} is {len(secret)} bytes, AES-256 needs {KEY_BYTES}; "
                f"{_MAKE_ONE}"
            )
        return cls(key_id, secret)


def generate_key(key_id: str | None = None) -> DataKey:
    """A new random key (``key_id`` or ``k-<8 hex>``)."""
    key_id = key_id or f"k-{secrets.token_hex(4)}"
    if not _KEY_ID.fullmatch(key_id):
        raise StoreError(f"key id {key_id!r}: use 1-40 letters, digits, '.', '_' or '-'")
    return DataKey(key_id, secrets.token_bytes(KEY_BYTES))


class Keyring:
    """The key that seals (``current``) and every key that opens, by id."""

    def __init__(self, current: DataKey | None, others: Iterable[DataKey] = ()) -> None:
        self.current = current
        self._keys: dict[str, DataKey] = {}
        for key in (*others, *([current] if current else [])):
            known = self._keys.get(key.key_id)
            if known is not None and known.secret != key.secret:
                raise StoreError(
                    f"two different keys have the id {key.key_id!r} ({KEY_VARIABLE}, "
                    f"{OLD_KEYS_VARIABLE}, key file): give each key an id of its own"
                )
            self._keys[key.key_id] = key
        self._ciphers: dict[str, AESGCM] = {}

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Keyring:
        env = os.environ if environ is None else environ
        current = env.get(KEY_VARIABLE, "").strip()
        old = [t for t in env.get(OLD_KEYS_VARIABLE, "").split(",") if t.strip()]
        return cls(
            DataKey.parse(current, KEY_VARIABLE) if current else None,
            [DataKey.parse(text, OLD_KEYS_VARIABLE) for text in old],
        )

    def ids(self) -> list[str]:
        return sorted(self._keys)

    def with_key(self, key: DataKey, *, current: bool) -> Keyring:
        others = [k for k in self._keys.values() if k is not self.current]
        if current:
            return Keyring(key, [*others, *([self.current] if self.current else [])])
        return Keyring(self.current, [*others, key])

    def seal(self, value: Any) -> str:
        key = self.current
        if key is None:
            raise UnstorableData("no key to encrypt sensitive values with")
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._cipher(key).encrypt(nonce, orjson.dumps(value), key.key_id.encode())
        token = base64.urlsafe_b64encode(nonce + sealed).decode().rstrip("=")
        return f"{SEALED_PREFIX}{key.key_id}:{token}"

    def open(self, token: str) -> Any:
        key_id, _, encoded = token[len(SEALED_PREFIX) :].partition(":")
        key = self._keys.get(key_id)
        if key is None:
            have = ", ".join(self.ids()) or "none"
            raise StateFormatError(
                f"a sensitive value is encrypted with key {key_id!r}, which this process "
                f"does not have (it has: {have}): set {KEY_VARIABLE}, or add the key to "
                f"{OLD_KEYS_VARIABLE}"
            )
        from cryptography.exceptions import InvalidTag

        try:
            raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
            plain = self._cipher(key).decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], key_id.encode())
        except (InvalidTag, ValueError, binascii.Error):
            raise StateFormatError(
                f"a sensitive value encrypted with key {key_id!r} does not decrypt with the "
                f"key of that id this process has: the key is not the one it was encrypted "
                f"with (or the stored value was changed)"
            ) from None
        return orjson.loads(plain)

    def _cipher(self, key: DataKey) -> AESGCM:
        cipher = self._ciphers.get(key.key_id)
        if cipher is None:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM

            cipher = self._ciphers[key.key_id] = AESGCM(key.secret)
        return cipher


# -- the key file of an embedded store --------------------------------------------


class KeyFile:
    """``<database>.key``: the key of a SQLite store when the environment gives none.
    Made (mode 0600) on the first sensitive value; two processes making it at once
    agree on one (the file appears whole, by a hard link, or not at all)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> DataKey | None:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        warn_if_exposed(self.path, "key file")
        return DataKey.parse(text, f"key file {self.path}")

    def read_or_make(self) -> DataKey:
        key = self.read()
        if key is not None:
            return key
        fresh = generate_key()
        temp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(fresh.text() + "\n")
                out.flush()
                os.fsync(out.fileno())
            with contextlib.suppress(FileExistsError):  # another process made it first
                os.link(temp, self.path)
        finally:
            temp.unlink(missing_ok=True)
        key = self.read()
        if key is None:  # pragma: no cover - removed between link and read
            raise StoreError(f"key file {self.path} vanished while it was made")
        _log.warning(
            "made key file %s for the sensitive values of %s: back it up with the database, "
            "or set %s (see docs/security.md)",
            self.path,
            self.path.with_suffix(""),
            KEY_VARIABLE,
        )
        return key


def warn_if_exposed(path: Path, what: str) -> None:
    """A warning when every user of the machine may read ``path`` (its mode is left as
    its operator set it)."""
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        return
    if mode & 0o006:
        _log.warning(
            "%s %s has mode %s: every user of this machine can read it; `chmod 600 %s`",
            what,
            path,
            oct(mode),
            path,
        )


# -- the sealer a store holds -------------------------------------------------------


class Sealer:
    """A store's sensitive names by plan, and its keys (resolved on first use).

    ``key_file``: the SQLite store's file, used when the environment has no current
    key; ``ephemeral``: a random key for this process only (a database that dies with
    it: ``sqlite:///:memory:``). Neither: no key without the environment (PostgreSQL).
    """

    def __init__(
        self,
        *,
        where: str,
        key_file: Path | None = None,
        ephemeral: bool = False,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._where = where
        self._key_file = KeyFile(key_file) if key_file is not None else None
        self._ephemeral = ephemeral
        self._environ = environ
        self._keyring: Keyring | None = None
        self._names: dict[str, SensitiveNames | None] = {}
        self._sealing: set[str] = set()
        """The plans of ``_names`` that declare sensitive names."""

    # names

    def learn(self, plan: Plan) -> None:
        if plan.hash not in self._names:
            names = self._names[plan.hash] = sensitive_names(plan)
            if names is not None:
                self._sealing.add(plan.hash)

    def knows(self, plan_hash: str) -> bool:
        return plan_hash in self._names

    def knows_all(self, plan_hashes: set[str]) -> bool:
        return self._names.keys() >= plan_hashes

    def for_plans(self, plan_hashes: set[str]) -> Sealer | None:
        """This sealer when a plan of ``plan_hashes`` (known ones) declares sensitive
        names; None when none does: their rows are written as they are, with no walk
        and no lookup per row (the common case of every commit)."""
        return None if self._sealing.isdisjoint(plan_hashes) else self

    def seal_nothing_for(self, plan_hash: str) -> None:
        """Record that ``plan_hash`` has no plan this store can read (a hand-made state
        in a test, a store opened without a plan compiler): nothing of it is sealed."""
        self._names.setdefault(plan_hash, None)

    def unknown(self, plan_hashes: Iterable[str]) -> set[str]:
        return {h for h in plan_hashes if h not in self._names}

    def names(self, plan_hash: str) -> SensitiveNames | None:
        return self._names.get(plan_hash)

    # keys

    def keyring(self) -> Keyring:
        if self._keyring is None:
            ring = Keyring.from_environment(self._environ)
            stored = self._key_file.read() if self._key_file is not None else None
            if stored is not None:
                ring = ring.with_key(stored, current=ring.current is None)
            self._keyring = ring
        return self._keyring

    def _sealing_keyring(self, what: str) -> Keyring:
        ring = self.keyring()
        if ring.current is None:
            if self._key_file is not None:
                ring = self._keyring = ring.with_key(self._key_file.read_or_make(), current=True)
            elif self._ephemeral:
                ring = self._keyring = ring.with_key(generate_key("ephemeral"), current=True)
            else:
                raise UnstorableData(
                    f"{what} has fields declared sensitive, and {self._where} stores them "
                    f"only encrypted: set {KEY_VARIABLE} to a key on every server and worker "
                    f"that uses this store ({_MAKE_ONE}); see docs/security.md"
                )
        return ring

    # values

    def seal(self, data: Any, names: SensitiveNames, what: str, *, eager: bool = False) -> Any:
        """``data`` (JSON-compatible) with the value of every sensitive key sealed.

        The key is looked for when a value is to be sealed; ``eager``: at once (a new
        run is refused before anything is written, even when its input holds none of
        the fields yet). Not eager, a row with nothing to seal (the failure of a run
        whose values cannot be sealed) is written without a key."""
        if eager:
            self._sealing_keyring(what)

        def seal_value(value: Any) -> str:
            return self._sealing_keyring(what).seal(value)

        return _seal(data, (), names, seal_value)

    def loads(self, text: str | bytes | None, what: str) -> Any:
        """Parse a stored JSON text, opening every sealed value in it."""
        if text is None:
            return None
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise StateFormatError(f"{what} is not valid JSON ({exc})") from None
        if isinstance(text, str):
            if SEALED_PREFIX not in text:
                return data
        elif SEALED_PREFIX.encode() not in text:
            return data
        return self.open_value(data, what)

    def open_value(self, data: Any, what: str) -> Any:
        """An already parsed value with every sealed value in it opened."""
        try:
            try:
                return _open(data, self.keyring())
            except StateFormatError:
                if self._key_file is None:
                    raise
                self._keyring = None  # another process may have made the key file since
                return _open(data, self.keyring())
        except StateFormatError as exc:
            hint = ""
            if self._key_file is not None and not self._key_file.path.exists():
                hint = f" (this SQLite file's key file {self._key_file.path} is missing)"
            raise StateFormatError(f"{what}: {exc.message}{hint}") from None


def _seal(
    obj: Any, path: tuple[str, ...], names: SensitiveNames, seal: Callable[[Any], str]
) -> Any:
    if isinstance(obj, dict):
        out: dict[Any, Any] = {}
        for key, value in obj.items():
            name = str(key)
            if value is not None and names.matches(name, path) and not _is_sealed(value):
                out[key] = seal(value)
            else:
                out[key] = _seal(value, (*path, name), names, seal)
        return out
    if isinstance(obj, list | tuple):
        return [_seal(item, path, names, seal) for item in obj]
    return obj


def _is_sealed(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(SEALED_PREFIX)


def _open(obj: Any, ring: Keyring) -> Any:
    if isinstance(obj, str):
        return ring.open(obj) if obj.startswith(SEALED_PREFIX) else obj
    if isinstance(obj, dict):
        return {key: _open(value, ring) for key, value in obj.items()}
    if isinstance(obj, list):
        return [_open(item, ring) for item in obj]
    return obj
