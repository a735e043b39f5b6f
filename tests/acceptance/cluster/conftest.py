"""The `cluster` fixture (harness.py): real server and worker processes per test."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from harness import cluster, private_cluster  # noqa: E402

__all__ = ["cluster", "private_cluster"]
