"""`tideflow run` with ``OTEL_TRACES_EXPORTER=console``: a real process exports its run's
spans (one trace, the attempts children of the run) as JSON on stderr; a wrong value is
refused before anything runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

TIDEFLOW = [sys.executable, "-m", "tideflow.cli.main"]
FLOW = 'name: cli\nversion: "1"\nsteps:\n  - {id: a, type: noop}\n  - {id: b, type: noop, depends_on: [a]}\n'


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "flow.yaml").write_text(FLOW)
    return subprocess.run(
        [*TIDEFLOW, "run", "flow.yaml"],
        cwd=tmp_path,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _spans(text: str) -> list[dict[str, Any]]:
    """The JSON objects the console exporter wrote, one after the other, among log lines."""
    decoder, spans, at = json.JSONDecoder(), [], text.find("{")
    while at != -1:
        try:
            value, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            at = text.find("{", at + 1)
            continue
        if isinstance(value, dict) and "context" in value:
            spans.append(value)
        at = text.find("{", end)
    return spans


@pytest.mark.slow
def test_a_run_exports_one_trace_to_the_console(tmp_path: Path) -> None:
    done = _run(tmp_path, OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="cli-test")
    assert done.returncode == 0, done.stderr
    exported = _spans(done.stderr)
    applied = [span for span in exported if span["name"] == "apply cli"]  # the engine's
    spans = {span["name"]: span for span in exported if span not in applied}
    assert set(spans) == {"run cli", "step a", "step b"} and applied
    run = spans["run cli"]
    assert {span["context"]["trace_id"] for span in exported} == {run["context"]["trace_id"]}
    assert spans["step a"]["parent_id"] == spans["step b"]["parent_id"] == run["context"]["span_id"]
    assert {span["parent_id"] for span in applied} == {run["context"]["span_id"]}
    assert run["resource"]["attributes"]["service.name"] == "cli-test"


@pytest.mark.slow
def test_an_unknown_exporter_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    wrong = _run(tmp_path, OTEL_TRACES_EXPORTER="zipkin")
    assert wrong.returncode == 2
    assert "OTEL_TRACES_EXPORTER=zipkin" in wrong.stderr
    assert not (tmp_path / ".tideflow").exists()  # refused before the store was made
    quiet = _run(tmp_path, OTEL_TRACES_EXPORTER="none")
    assert quiet.returncode == 0, quiet.stderr
    assert _spans(quiet.stderr) == []
