"""Secret references as they travel from the core to a worker.

The core never sees secret values. When it renders a template that reads
``secrets.NAME`` it gets a *marker* string instead; the worker replaces markers
with the real values just before the executor runs, and only for the names that
the step's own templates reference (listed on the DispatchTask), so a marker
smuggled in through run input cannot pull in any other secret.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

MARKER_PREFIX = "\u27e6secret:"
MARKER_SUFFIX = "\u27e7"
MARKER_RE = re.compile("\u27e6secret:([A-Za-z_][A-Za-z0-9_]*)\u27e7")


def secret_marker(name: str) -> str:
    """The placeholder that stands for secret ``name`` in rendered values."""
    return f"{MARKER_PREFIX}{name}{MARKER_SUFFIX}"


class SecretMarkers(Mapping[str, str]):
    """The ``secrets`` name in the core's expression scope: every key maps to its marker."""

    def __getitem__(self, name: str) -> str:
        return secret_marker(name)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str)
