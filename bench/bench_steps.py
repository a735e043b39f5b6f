"""The function behind the benchmark's ``python`` rows: a plain, module-level sync
function, as users write them (imported by ``bench/run.py`` as ``bench_steps:step``)."""

from __future__ import annotations


def step() -> None:
    """Does nothing: the row measures the engine, not the function."""
