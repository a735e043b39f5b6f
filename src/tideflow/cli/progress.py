"""Live progress of a run's steps in the terminal (rich)."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console
from rich.live import Live
from rich.table import Table

from tideflow.cli.render import STATUS_STYLE

if TYPE_CHECKING:
    from tideflow.model.events import Transition
    from tideflow.model.plan import Plan
    from tideflow.model.run import RunState


class Progress:
    """Renders one row per step instance, updated on every committed transition."""

    def __init__(self, console: Console, plan: Plan, run_id: str) -> None:
        self._plan = plan
        self.run_id = run_id
        """Only this run is shown (a durable store's other runs may be resumed alongside)."""
        self._rows: dict[str, tuple[str, int]] = {}
        self._run_status = "pending"
        self._live = Live(self._render(), console=console, refresh_per_second=12, transient=False)

    def __enter__(self) -> Progress:
        self._live.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._live.update(self._render())
        self._live.__exit__(exc_type, exc, tb)

    def update(self, state: RunState, transitions: Sequence[Transition]) -> None:
        if state.run_id != self.run_id:
            return
        for tr in transitions:
            if tr.subject == "run":
                self._run_status = tr.new
            else:
                self._rows[tr.subject] = (
                    tr.new,
                    tr.attempt or self._rows.get(tr.subject, ("", 0))[1],
                )
        self._live.update(self._render())

    def _render(self) -> Table:
        table = Table(
            title=f"{self._plan.name} {self._plan.version} — {self._run_status}", expand=False
        )
        table.add_column("step")
        table.add_column("status")
        table.add_column("attempt", justify="right")
        for key, (status, attempt) in self._rows.items():
            style = STATUS_STYLE.get(status, "")
            table.add_row(key, f"[{style}]{status}[/]" if style else status, str(attempt or ""))
        return table
