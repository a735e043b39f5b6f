"""Where each value of a loaded definition was written.

`Positions` maps JSON-path-like tuples (``("steps", 3, "retry", "backoff")``) to
1-based ``(line, column)``. The YAML loader records them while it walks the node
tree; a JSON definition fills them in only when first asked (`Positions.deferred`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

__all__ = ["DataPath", "Position", "Positions", "format_path"]

DataPath = tuple[str | int, ...]
Position = tuple[int, int]


def format_path(path: Iterable[str | int]) -> str:
    """``("steps", 3, "retry")`` -> ``steps[3].retry``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


class _Table:
    """The recorded positions, shared by every relinked view of them."""

    __slots__ = ("blocks", "filler", "keys", "quoted", "values")

    def __init__(self, filler: Callable[[Positions], None] | None = None) -> None:
        self.values: dict[DataPath, Position] = {}
        self.keys: dict[DataPath, Position] = {}
        self.quoted: set[DataPath] = set()
        self.blocks: set[DataPath] = set()
        self.filler = filler


class Positions:
    """Where each value (and each mapping key) of a loaded definition starts.

    Lookups fall back to the nearest enclosing value, so a path that does not exist
    in the source (a default filled in later) still points somewhere useful. A
    derived view (`relinked`) maps paths of a rewritten tree back to the source.
    """

    def __init__(self) -> None:
        self._table = _Table()
        self._links: dict[DataPath, DataPath] = {}

    @classmethod
    def deferred(cls, filler: Callable[[Positions], None]) -> Positions:
        """Positions that ``filler`` records (through `set_position`) on the first lookup."""
        positions = cls()
        positions._table.filler = filler
        return positions

    @property
    def _values(self) -> dict[DataPath, Position]:
        table = self._table
        if table.filler is not None:
            filler, table.filler = table.filler, None
            recorder = Positions()
            recorder._table = table
            filler(recorder)
        return table.values

    def __getitem__(self, path: DataPath) -> Position:
        return self._values[self._resolve(path)]

    def __contains__(self, path: object) -> bool:
        return isinstance(path, tuple) and self._resolve(path) in self._values

    def __len__(self) -> int:
        return len(self._values)

    def get(self, path: DataPath) -> Position | None:
        """The exact position of the value at ``path``, or None."""
        return self._values.get(self._resolve(path))

    def peek(self, path: DataPath) -> Position | None:
        """Like `find`, but None instead of computing deferred positions."""
        return None if self._table.filler is not None else self.find(path)

    def find(self, path: DataPath) -> Position | None:
        """The position of ``path`` or of its nearest ancestor that has one."""
        values = self._values
        for size in range(len(path), -1, -1):
            found = values.get(self._resolve(path[:size]))
            if found is not None:
                return found
        return None

    def key(self, path: DataPath) -> Position | None:
        """Where the mapping key that ends ``path`` is written (else `find`)."""
        self._values  # noqa: B018 -- fills deferred positions, keys included
        return self._table.keys.get(self._resolve(path)) or self.find(path)

    def content_offset(self, path: DataPath) -> int | None:
        """Columns between the value's start and its text; None for a block scalar."""
        self._values  # noqa: B018
        source = self._resolve(path)
        if source in self._table.blocks:
            return None
        return 1 if source in self._table.quoted else 0

    def source_path(self, path: DataPath) -> DataPath:
        """Where the value at ``path`` (of a rewritten tree) was written."""
        return self._resolve(path)

    def set_position(
        self,
        path: DataPath,
        value: Position,
        key: Position | None = None,
        *,
        quoted: bool = False,
        block: bool = False,
    ) -> None:
        table = self._table
        table.values[path] = value
        if key is not None:
            table.keys[path] = key
        if quoted:
            table.quoted.add(path)
        elif block:
            table.blocks.add(path)

    def relinked(self, links: Mapping[DataPath, DataPath]) -> Positions:
        """A view in which a path under a key of ``links`` reads the linked source path."""
        view = Positions()
        view._table = self._table
        view._links = {**self._links, **links}
        return view

    def _resolve(self, path: DataPath) -> DataPath:
        if not self._links:
            return path
        for size in range(len(path), 0, -1):
            target = self._links.get(path[:size])
            if target is not None:
                return target + path[size:]
        return path
