"""Durations as the DSL writes them: the parser lives in `tideflow.model.durations`."""

from __future__ import annotations

from tideflow.model.durations import DURATION_HINT, DurationTooLong, parse_duration

__all__ = ["DURATION_HINT", "DurationTooLong", "parse_duration"]
