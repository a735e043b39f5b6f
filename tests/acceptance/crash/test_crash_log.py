"""The crash tests' execution log survives a record torn by SIGKILL.

Linux may cut a ``write()`` to a file where it crosses a page boundary when a
fatal signal is pending, so a killed driver can leave part of a record behind and
the next process appends to it (seen in CI: two records on one line, and the kill -9
test failed on the log rather than on the engine).
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import crash_steps  # noqa: E402
from crash_checks import read_log  # noqa: E402


def _ctx(step_key: str, attempt: int = 1) -> Any:
    return SimpleNamespace(
        run_id="r-1", step_key=step_key, attempt=attempt, idempotency_key=f"r-1:{step_key}"
    )


def test_a_torn_record_loses_only_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "executions.jsonl"
    monkeypatch.setenv(crash_steps.LOG_ENV, str(log))
    crash_steps._record(_ctx("a"), "start", False)
    crash_steps._record(_ctx("a"), "end", False)
    first, offset = read_log(log)
    assert [(ex.instance[1], ex.phase) for ex in first] == [("a", "start"), ("a", "end")]

    crash_steps._record(_ctx("b"), "start", False)
    whole = log.read_bytes()
    log.write_bytes(whole[: len(whole) - 40])  # the process was killed mid-write
    torn, offset = read_log(log, offset)
    assert torn == []  # nothing complete yet: the reader waits for a whole line

    crash_steps._record(_ctx("b"), "start", False)  # the next process runs b again
    crash_steps._record(_ctx("b"), "end", False)
    after, _ = read_log(log, offset)
    assert [(ex.instance[1], ex.phase) for ex in after] == [("b", "start"), ("b", "end")]
