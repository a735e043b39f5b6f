"""Ordering definition versions: numerically where the parts are numbers (1.10 > 1.9)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def version_key(version: str) -> tuple[Any, ...]:
    parts: list[Any] = []
    for piece in version.replace("-", ".").replace("+", ".").split("."):
        parts.append((0, int(piece), "") if piece.isdigit() else (1, 0, piece))
    return tuple(parts)


def latest(versions: Iterable[str]) -> str | None:
    """The highest version, or None when there is none."""
    return max(versions, key=version_key, default=None)
