"""How long a signal that no wait takes yet is kept: a wait's ``buffer``."""

from __future__ import annotations

import pytest
from tests.unit.core.conftest import plan_of

from tideflow.errors import DefinitionError
from tideflow.model.plan import DEFAULT_SIGNAL_BUFFER

HEAD = """
name: t
version: "1"
"""

LATER_WAIT = """
steps:
  - {id: a, type: noop}
  - {id: w, type: wait, signal: go, depends_on: [a]%s}
"""


def _early(harness, buffer: str, wait_after: float):
    """A signal sent before its wait starts, the wait reached ``wait_after`` s later."""
    h = harness(HEAD + LATER_WAIT % buffer)
    h.signal("go", {"early": True})
    h.advance(wait_after)
    h.complete("a")
    return h


def test_a_signal_within_its_buffer_is_taken_by_the_later_wait(harness):
    h = _early(harness, ", buffer: 10m", 600)
    assert h.step_status("w") == "succeeded"
    assert h.state.steps["w"].output == {"early": True}
    assert h.state.signals == []


def test_a_signal_kept_longer_than_its_buffer_is_forgotten(harness):
    h = _early(harness, ", buffer: 10m", 601)
    assert h.step_status("w") == "waiting"
    assert h.state.signals == []
    h.signal("go", {"late": True})
    assert h.state.steps["w"].output == {"late": True}


def test_the_default_buffer_is_a_day(harness):
    assert DEFAULT_SIGNAL_BUFFER == 24 * 3600
    assert _early(harness, "", DEFAULT_SIGNAL_BUFFER).step_status("w") == "succeeded"
    assert _early(harness, "", DEFAULT_SIGNAL_BUFFER + 1).step_status("w") == "waiting"


@pytest.mark.parametrize("off", ["false", "0s"])
def test_buffer_false_drops_a_signal_that_comes_early(harness, off):
    h = harness(HEAD + LATER_WAIT % f", buffer: {off}")
    h.signal("go", {"early": True})
    assert h.state.signals == []
    h.complete("a")
    assert h.step_status("w") == "waiting"
    h.signal("go", {"on time": True})
    assert h.state.steps["w"].output == {"on time": True}


def test_defaults_buffer_applies_to_every_wait_that_does_not_set_its_own(harness):
    definition = HEAD + "defaults: {buffer: false}\n" + LATER_WAIT % ""
    h = harness(definition)
    h.signal("go", {"early": True})
    assert h.state.signals == []
    own = harness(HEAD + "defaults: {buffer: false}\n" + LATER_WAIT % ", buffer: 1h")
    own.signal("go", {"early": True})
    assert len(own.state.signals) == 1


def test_the_longest_buffer_of_the_waits_for_a_name_keeps_it(harness):
    h = harness(
        HEAD
        + """
steps:
  - {id: a, type: noop}
  - {id: first, type: wait, signal: go, buffer: false, depends_on: [a]}
  - {id: second, type: wait, signal: go, buffer: 1h, depends_on: [first]}
"""
    )
    h.signal("go", {"n": 1})
    h.advance(1800)
    h.complete("a")
    assert h.state.steps["first"].output == {"n": 1}
    assert h.step_status("second") == "waiting"


def test_an_expired_signal_is_forgotten_when_another_arrives(harness):
    h = harness(HEAD + LATER_WAIT % ", buffer: 1m")
    h.signal("go", {"n": 1})
    h.advance(61)
    h.signal("go", {"n": 2})
    assert [s.payload for s in h.state.signals] == [{"n": 2}]


@pytest.mark.parametrize(
    ("value", "says"),
    [("true", "buffer: true is not a duration"), ("-5", "zero or more"), ("soon", "duration")],
)
def test_a_buffer_that_is_not_a_duration_or_false_is_refused(value, says):
    with pytest.raises(DefinitionError) as caught:
        plan_of(HEAD + LATER_WAIT % f", buffer: {value}")
    assert says in str(caught.value)
    assert "or false to drop it" in str(caught.value)
