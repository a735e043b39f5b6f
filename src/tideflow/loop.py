"""The event loop tideflow runs on: uvloop where it is installed, asyncio's own otherwise.

Every ``tideflow`` command runs its coroutine with :func:`run`, and so can a program
that embeds a `Runtime`::

    import tideflow.loop

    async def main() -> None:
        async with Runtime() as rt:
            ...

    tideflow.loop.run(main())  # like asyncio.run(main()), on the faster loop

uvloop (libuv under the asyncio API) is a dependency of tideflow on Linux and macOS. The
engine hands each step across several tasks and threads, and every hand-over is a turn
of the loop: on uvloop a turn costs less, which ``bench/run.py`` measures (``--loop``).
``asyncio.run`` works just as well, only slower; tideflow needs nothing of the loop
beyond the asyncio API.

``TIDEFLOW_LOOP`` chooses: ``uvloop`` (the default where it is installed), ``asyncio``
(the standard library's loop, e.g. to rule the loop out when chasing a problem), or
``auto`` (the same as unset).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

from tideflow.errors import TideflowError

T = TypeVar("T")

ENV = "TIDEFLOW_LOOP"
"""The environment variable that chooses the loop."""
CHOICES = ("auto", "uvloop", "asyncio")

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def loop_name(environ: Mapping[str, str] | None = None) -> str:
    """``"uvloop"`` or ``"asyncio"``: the loop :func:`run` uses with this environment."""
    environ = os.environ if environ is None else environ
    asked = environ.get(ENV, "").strip().lower() or "auto"
    if asked not in CHOICES:
        raise TideflowError(
            f"{ENV}={environ[ENV]!r} names no event loop: use uvloop, asyncio or auto "
            "(or leave it unset)"
        )
    if asked == "asyncio":
        return "asyncio"
    if _uvloop_factory() is not None:
        return "uvloop"
    if asked == "uvloop":
        raise TideflowError(
            f"{ENV}=uvloop, but uvloop is not installed here (it is not made for Windows "
            "nor for other Pythons than CPython): `pip install uvloop`, or unset "
            f"{ENV} to use asyncio's own loop"
        )
    return "asyncio"


def loop_factory(environ: Mapping[str, str] | None = None) -> LoopFactory:
    """What makes a new loop of the kind :func:`loop_name` chooses."""
    if loop_name(environ) == "uvloop":
        factory = _uvloop_factory()
        assert factory is not None
        return factory
    return asyncio.new_event_loop


def run(main: Coroutine[Any, Any, T], *, debug: bool | None = None) -> T:
    """``asyncio.run(main)`` on the loop :func:`loop_name` chooses: the same life cycle
    (Ctrl-C cancels ``main``, async generators and the default executor are shut down,
    the loop is closed)."""
    try:
        factory = loop_factory()
    except TideflowError:
        main.close()  # never awaited: no "coroutine was never awaited" warning on top
        raise
    with asyncio.Runner(loop_factory=factory, debug=debug) as runner:
        return runner.run(main)


def _uvloop_factory() -> LoopFactory | None:
    try:
        import uvloop
    except ImportError:
        return None
    new: LoopFactory = uvloop.new_event_loop
    return new


__all__ = ["CHOICES", "ENV", "loop_factory", "loop_name", "run"]
