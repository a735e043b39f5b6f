"""What a person may see of a value: the one set of masking rules.

:func:`mask` is used by everything that shows run data -- log lines
(``tideflow.observability.logs``), API answers (run, history, step views, attempts,
run lists), the web UI (which reads those answers) and the CLI (``runs show``,
``runs history``, ``runs list``). Two rules:

- a key a definition declares ``sensitive`` (a plain name at any depth; a dotted name a
  path from the top of the value, lists transparent);
- a key that names a credential (:func:`is_credential_key`): ``password``, ``passwd``,
  ``pwd``, ``secret``, ``token``, ``authorization``, ``api_key``, ``cookie``,
  ``credential``, ``private_key``, ``access_key``, ``client_secret`` ..., as a word of
  the key (``db_password``, ``accessToken``, ``X-Api-Key``), not inside another word
  (``passenger``, ``tokenizer`` are shown).

The value of such a key is replaced by a placeholder (``***``; logs say
``[redacted]``), whatever it is.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["PLACEHOLDER", "is_credential_key", "mask"]

PLACEHOLDER = "***"

_CREDENTIAL_WORDS = re.compile(
    r"(?:^|_)(?:pass(?:word|wd|phrase)?|pwd|secrets?|tokens?|authori[sz]ation|auth|api_?keys?"
    r"|cookies?|credentials?|private_?keys?|access_?keys?|secret_?keys?)(?:_|$)"
)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SEPARATORS = re.compile(r"[^A-Za-z0-9]+")


def is_credential_key(key: str) -> bool:
    """Whether a mapping key names a credential (see the module docstring)."""
    known = _KNOWN.get(key)
    if known is None:
        if len(_KNOWN) >= 4096:  # the same few keys come by again and again; a bound
            _KNOWN.clear()
        words = _SEPARATORS.sub("_", _CAMEL.sub("_", key)).lower()
        known = _KNOWN[key] = _CREDENTIAL_WORDS.search(words) is not None
    return known


_KNOWN: dict[str, bool] = {}


def mask(
    value: Any,
    sensitive: Iterable[str] = (),
    *,
    placeholder: str = PLACEHOLDER,
    text: Callable[[str], str] | None = None,
) -> Any:
    """``value`` with the value of every sensitive or credential key replaced.

    ``sensitive``: the field names a definition declares. ``text``: applied to every
    string left (logs mask credentials inside free text too); with it, a value that is
    not JSON-like is shown as ``text(str(value))``. Without ``text``, a value with
    nothing to mask comes back as it is, not copied (a run's result masks every step's
    output: the common case must cost little).
    """
    if text is None:
        if value.__class__ in _SCALARS:
            return value
        if not sensitive:
            return _hide(value, _NONE, placeholder)
    names = set(sensitive)
    plain = frozenset(n for n in names if "." not in n) if names else _NONE
    dotted = frozenset(names - plain) if names else _NONE
    if text is None and not dotted:
        return _hide(value, plain, placeholder)
    return _mask(value, (), plain, dotted, placeholder, text)


_NONE: frozenset[str] = frozenset()
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _hide(value: Any, plain: frozenset[str], placeholder: str) -> Any:
    """``_mask`` for plain names and no ``text``: dicts and lists, copied only where a
    value is masked."""
    cls = value.__class__
    if cls is dict:
        copy: dict[Any, Any] | None = None
        for key, item in value.items():
            name = key if key.__class__ is str else str(key)
            credential = _KNOWN.get(name)
            if credential is None:
                credential = is_credential_key(name)
            if credential or name in plain:
                new: Any = placeholder
            elif item.__class__ in _SCALARS:
                continue
            else:
                new = _hide(item, plain, placeholder)
                if new is item:
                    continue
            if copy is None:
                copy = dict(value)
            copy[key] = new
        return value if copy is None else copy
    if cls is list:
        items = [_hide(item, plain, placeholder) for item in value]
        return value if all(new is old for new, old in zip(items, value, strict=True)) else items
    if cls in _SCALARS:
        return value
    return _mask(value, (), plain, _NONE, placeholder, None)


def _mask(
    value: Any,
    path: tuple[str, ...],
    plain: frozenset[str],
    dotted: frozenset[str],
    placeholder: str,
    text: Callable[[str], str] | None,
) -> Any:
    """Without ``text`` a container with nothing to mask comes back as it is (no copy:
    the common case costs a walk and no allocation)."""
    if isinstance(value, str):
        return value if text is None else text(value)
    if isinstance(value, Mapping):
        return _mask_mapping(value, path, plain, dotted, placeholder, text)
    if isinstance(value, list | tuple | set | frozenset):
        items = [_mask(item, path, plain, dotted, placeholder, text) for item in value]
        if text is None and all(new is old for new, old in zip(items, value, strict=True)):
            return value
        return items
    if text is None or value is None or isinstance(value, bool | int | float):
        return value
    return text(str(value))


def _mask_mapping(
    value: Mapping[Any, Any],
    path: tuple[str, ...],
    plain: frozenset[str],
    dotted: frozenset[str],
    placeholder: str,
    text: Callable[[str], str] | None,
) -> Any:
    out: dict[Any, Any] = {}
    changed = text is not None
    for key, item in value.items():
        name = str(key)
        here = (*path, name) if dotted else path
        if name in plain or is_credential_key(name) or (dotted and ".".join(here) in dotted):
            new: Any = placeholder
        else:
            new = _mask(item, here, plain, dotted, placeholder, text)
        changed = changed or new is not item
        out[key if text is None else name] = new
    return out if changed else value
