"""The answer of ``GET /runs/{run_id}/logs``: what each attempt of a run's steps wrote
(runtime/steplogs.py reads it from the history)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from tideflow.api.times import Time
from tideflow.runtime.steplogs import logs_of
from tideflow.store.base import HistoryEntry

__all__ = ["AttemptLogsRow", "StepLogList", "StreamRow", "step_logs_of"]


class StreamRow(BaseModel):
    text: str
    truncated: int = Field(
        description="Bytes written before `text` that were not kept (0: `text` is all of it)"
    )


class AttemptLogsRow(BaseModel):
    step_key: str
    round: int
    attempt: int
    compensation: bool
    outcome: str = Field(description="succeeded or failed")
    ended_at: Time
    streams: dict[str, StreamRow] = Field(
        description="Each stream the attempt wrote to: stdout, stderr, log (its `logging` "
        "records); empty when it wrote nothing"
    )


class StepLogList(BaseModel):
    run_id: str
    step: str | None
    attempts: list[AttemptLogsRow] = Field(description="In the order they ended")


def step_logs_of(run_id: str, step: str | None, history: list[HistoryEntry]) -> StepLogList:
    rows = [
        AttemptLogsRow(
            step_key=row.step_key,
            round=row.round,
            attempt=row.attempt,
            compensation=row.compensation,
            outcome=row.outcome,
            ended_at=row.time,
            streams={
                name: StreamRow(text=stream.text, truncated=stream.truncated)
                for name, stream in row.streams.items()
            },
        )
        for row in logs_of(history, step)
    ]
    return StepLogList(run_id=run_id, step=step, attempts=rows)
