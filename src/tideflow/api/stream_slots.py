"""How many event streams the API keeps open: per API token, and in all.

A stream takes a slot before it starts (``StreamSlots.take``) and gives it back when it
ends, the moment its reader disconnects included. Past either cap the request is refused
with ``TooManyStreams`` (HTTP 429 with ``Retry-After``), before any store read: one
viewer token cannot hold every connection and store read of the server. Requests without
authentication (``--no-auth``, the local `tideflow ui`) are one holder, ``LOCAL``.
Nothing here does I/O or imports an HTTP framework.
"""

from __future__ import annotations

from tideflow.api.auth import Principal
from tideflow.errors import TooManyStreams

__all__ = [
    "DEFAULT_MAX_STREAMS",
    "DEFAULT_MAX_STREAMS_PER_TOKEN",
    "LOCAL",
    "RETRY_AFTER",
    "Slot",
    "StreamSlots",
]

DEFAULT_MAX_STREAMS = 500
"""Streams open at once on one server (each holds a connection and a task)."""
DEFAULT_MAX_STREAMS_PER_TOKEN = 20
"""Streams open at once with one API token: a few browser tabs of the web UI (a browser
opens at most six connections to one server over HTTP/1.1) and some scripts."""
RETRY_AFTER = 5
"""Seconds a refused client is told to wait (``Retry-After``) before it tries again."""
LOCAL = "local"
"""The holder of every stream of a request without a token (authentication off)."""


class Slot:
    """One open stream's place; ``release`` (once, or more: the same) gives it back."""

    def __init__(self, slots: StreamSlots, holder: str) -> None:
        self._slots, self.holder = slots, holder
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._slots._give_back(self.holder)


class StreamSlots:
    def __init__(
        self,
        *,
        total: int = DEFAULT_MAX_STREAMS,
        per_token: int = DEFAULT_MAX_STREAMS_PER_TOKEN,
    ) -> None:
        """ValueError unless both caps are at least 1."""
        for name, cap in (("max_streams", total), ("max_streams_per_token", per_token)):
            if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
                raise ValueError(f"{name} must be a whole number of streams, at least 1")
        self.total, self.per_token = total, per_token
        self._held: dict[str, int] = {}
        self.open = 0
        """Streams open now."""

    def take(self, principal: Principal | None) -> Slot:
        """A slot for a stream of ``principal`` (None: authentication is off);
        ``TooManyStreams`` past a cap."""
        holder = LOCAL if principal is None else principal.token_id
        held = self._held.get(holder, 0)
        if held >= self.per_token:
            raise TooManyStreams(
                f"{_who(principal)} has {held} event streams open, as many as one token may "
                f"(max_streams_per_token {self.per_token}, `tideflow server "
                f"--max-streams-per-token`): close one (a browser tab, an EventSource) or "
                f"retry after {RETRY_AFTER} s",
                retry_after=RETRY_AFTER,
            )
        if self.open >= self.total:
            raise TooManyStreams(
                f"the server has {self.open} event streams open, as many as it serves "
                f"(max_streams {self.total}, `tideflow server --max-streams`): retry after "
                f"{RETRY_AFTER} s",
                retry_after=RETRY_AFTER,
            )
        self._held[holder] = held + 1
        self.open += 1
        return Slot(self, holder)

    def held(self, principal: Principal | None) -> int:
        """Streams ``principal`` has open now."""
        return self._held.get(LOCAL if principal is None else principal.token_id, 0)

    def _give_back(self, holder: str) -> None:
        self.open -= 1
        left = self._held[holder] - 1
        if left:
            self._held[holder] = left
        else:
            del self._held[holder]


def _who(principal: Principal | None) -> str:
    if principal is None:
        return "the local user (no authentication)"
    if principal.token_id == LOCAL:
        return principal.name
    return f"API token {principal.token_id} ({principal.name})"
