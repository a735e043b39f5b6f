"""Keyset pagination cursors for run listings: newest first by (created_at, run_id)."""

from __future__ import annotations

import base64
import math

from tideflow.errors import BadCursor as BadCursor  # the class lives in the one tree


def encode_cursor(created_at: float, run_id: str) -> str:
    raw = f"{created_at!r}|{run_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        created, _, run_id = base64.urlsafe_b64decode(padded).decode().partition("|")
        at = float(created)
        if not math.isfinite(at):  # no page starts at NaN or infinity: it was not ours
            raise ValueError(created)
        return at, run_id
    except (ValueError, UnicodeDecodeError):
        raise BadCursor(
            f"invalid cursor {cursor!r}: pass the next_cursor of a previous page"
        ) from None
