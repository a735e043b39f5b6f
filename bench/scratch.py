"""Scratch directories of the benchmarks: made fresh for each store, removed when the
process exits (a run of the suite made one per measurement, and /tmp kept them all)."""

from __future__ import annotations

import atexit
import shutil
import tempfile


def scratch_dir(prefix: str) -> str:
    """A new empty directory, removed with everything in it when the process exits."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, True)
    return path
