"""What the long-running processes (`tideflow server`, `tideflow worker`) share: log lines
on stderr, and a stop asked for by SIGTERM or SIGINT (Ctrl-C).

A process waits for ``Stop.wait()``; the first SIGTERM or SIGINT sets it and the
process stops cleanly (finishes what it is doing, hands back the rest). A second one
while it is stopping is logged and ignored: a supervisor that wants it gone at once
sends SIGKILL, which the cluster is built to survive.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

log = logging.getLogger("tideflow")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_to_stderr(level: int | str = logging.INFO) -> None:
    """One line per record on stderr, with time, level and logger (once per process)."""
    root = logging.getLogger()
    if any(getattr(h, "tideflow", False) for h in root.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.tideflow = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)


class Stop:
    """Set by the first SIGTERM or SIGINT once ``install`` ran on the running loop."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.signal: str | None = None
        self._signals: list[signal.Signals] = []

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._received, sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
                continue
            self._signals.append(sig)

    def uninstall(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in self._signals:
            loop.remove_signal_handler(sig)
        self._signals.clear()

    def set(self, reason: str) -> None:
        if not self._event.is_set():
            self.signal = reason
            self._event.set()

    def _received(self, sig: signal.Signals) -> None:
        if self._event.is_set():
            log.warning(
                "%s received while stopping: still stopping (SIGKILL stops at once)", sig.name
            )
            return
        log.info("%s received: stopping", sig.name)
        self.set(sig.name)

    @property
    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        await self._event.wait()


def shown(url: str) -> str:
    """A URL as logs show it: its password masked."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if not password:
        return url
    netloc = parts.netloc.replace(f":{password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


__all__ = ["LOG_FORMAT", "Stop", "log_to_stderr", "shown"]
