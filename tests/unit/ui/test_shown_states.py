"""The UI, the CLI and runtime/shown.py name the same shown states: every step state
(the core's and a compensation's) is in the UI's legend with a colour of its own in the
graph, every attempt outcome has a colour in the timeline, and the CLI styles them all."""

from __future__ import annotations

import json
import re

from tideflow.cli.render import STATUS_STYLE
from tideflow.model.states import StepStatus
from tideflow.runtime.shown import ATTEMPT_OUTCOMES, COMPENSATION_SHOWN, SHOWN_STEP_STATES
from tideflow.ui.app import STATIC

APP = (STATIC / "app.js").read_text()
STYLE = (STATIC / "style.css").read_text()
STEP_STATES = [s.value for s in StepStatus] + list(SHOWN_STEP_STATES)


def listed(name: str) -> list[str]:
    found = re.search(rf"const {name} = (\[[^\]]*\]);", APP)
    assert found is not None, name
    return list(json.loads(found.group(1)))


def test_the_ui_lists_every_shown_state_and_outcome() -> None:
    assert listed("STATUSES") == STEP_STATES
    assert listed("OUTCOMES") == list(ATTEMPT_OUTCOMES)
    assert set(COMPENSATION_SHOWN.values()) == set(SHOWN_STEP_STATES)


def test_every_shown_state_and_outcome_has_its_colour() -> None:
    for state in STEP_STATES:
        assert f"svg.graph .status-{state} rect" in STYLE, state
        assert re.search(rf"\.badge\.{state} \{{", STYLE), state
    for outcome in ATTEMPT_OUTCOMES:
        assert f"svg.gantt .bar.{outcome} " in STYLE, outcome
        assert f".legend svg .bar.{outcome} " in STYLE, outcome
    fills = {
        state: re.search(rf"--{state}: (#[0-9a-f]+)", STYLE)
        for state in ("compensating", "compensated", "compensation_failed", "succeeded")
    }
    colours = {state: match.group(1) for state, match in fills.items() if match}
    assert len(set(colours.values())) == 4, colours  # compensated is not succeeded's green


def test_the_cli_styles_every_shown_state_and_outcome() -> None:
    assert set(STEP_STATES) | set(ATTEMPT_OUTCOMES) <= set(STATUS_STYLE)
