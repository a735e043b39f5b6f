"""What an older tideflow stored or sent, before attempts were named by round, still
decodes: an outbox command without ``round`` is round 0, as is a run snapshot without
``retries`` and a cancel on the control channel without ``round`` (or without
``compensation``: an action's attempt); the ``forget`` control message it sent on a retry
decodes to nothing (rounds do its job). A task event without ``round`` (a history row, a
message on the bus) decodes with round None: the run's current round, as that version
applied it."""

from __future__ import annotations

import orjson

from tideflow.bus.backends import nats, redis_wire
from tideflow.bus.base import CancelAttempt
from tideflow.model import codec
from tideflow.model.commands import CancelTask, DispatchTask
from tideflow.model.events import ErrorInfo, TaskCompleted, TaskFailed, TaskLost, TaskStarted
from tideflow.model.run import new_run_state

TASK = DispatchTask(
    run_id="r",
    step_key="a",
    step_id="a",
    type="noop",
    config={},
    input=None,
    attempt=2,
    idempotency_key="r:a",
    timeout=None,
    round=3,
)


def test_commands_stored_without_a_round_are_round_0() -> None:
    for command in (TASK, CancelTask(run_id="r", step_key="a", attempt=2, round=3)):
        data = orjson.loads(orjson.dumps(codec.command_to_data(command)))
        assert codec.command_from_data(data) == command
        assert data.pop("round") == 3
        assert codec.command_from_data(data).round == 0  # type: ignore[attr-defined]


def test_a_cancel_stored_without_compensation_names_the_actions_attempt() -> None:
    cancel = CancelTask(run_id="r", step_key="a", attempt=2, round=1, compensation=True)
    data = orjson.loads(orjson.dumps(codec.command_to_data(cancel)))
    assert codec.command_from_data(data) == cancel
    del data["compensation"]
    assert codec.command_from_data(data) == CancelTask(run_id="r", step_key="a", attempt=2, round=1)


COMMON = {"event_id": "e", "run_id": "r", "time": 1.0, "step_key": "a", "attempt": 2}
EVENTS = [
    TaskStarted(**COMMON, worker="h/1", round=3),
    TaskCompleted(**COMMON, output={"x": 1}, round=3),
    TaskFailed(**COMMON, error=ErrorInfo(type="E", message="m"), seed=5, round=3),
    TaskLost(**COMMON, compensation=True, round=3),
]


def test_task_events_carry_their_round_and_one_stored_without_it_is_of_the_current_round() -> None:
    for event in EVENTS:
        data = orjson.loads(orjson.dumps(codec.event_to_data(event)))
        assert codec.event_from_data(data) == event
        assert data.pop("round") == 3
        old = codec.event_from_data(data)
        assert type(old) is type(event) and old.round is None  # type: ignore[attr-defined]
        # stored again (a history row, a redelivery), it stays a version-before-rounds event
        assert codec.event_from_data(codec.event_to_data(old)) == old
    assert TaskCompleted(**COMMON).round == 0  # made by this version without one: round 0


def test_task_events_carry_their_round_on_the_redis_wire() -> None:
    for event in EVENTS:
        fields = {b"b": redis_wire.encode_event(event)}
        assert redis_wire.decode_event(fields)[0] == event
        data = codec.event_to_data(event)
        del data["round"]
        old, _, _ = redis_wire.decode_event({b"b": orjson.dumps(data)})
        assert old.round is None  # type: ignore[attr-defined]


def test_a_snapshot_without_retries_is_round_0() -> None:
    state = new_run_state(run_id="r", workflow="w", version="1", plan_hash="h", created_at=0.0)
    state.retries = 2
    data = codec.state_to_data(state)
    assert codec.state_from_data(data).retries == 2
    del data["retries"]
    assert codec.state_from_data(data).retries == 0


def test_a_cancel_sent_without_a_round_is_round_0_on_redis() -> None:
    cancel = CancelAttempt(run_id="r", step_key="a", attempt=2, round=1)
    assert redis_wire.decode_control(redis_wire.encode_control(cancel)) == cancel
    old = orjson.dumps({"kind": "cancel", "run_id": "r", "step_key": "a", "attempt": 2})
    assert redis_wire.decode_control(old) == CancelAttempt(run_id="r", step_key="a", attempt=2)
    assert redis_wire.decode_control(orjson.dumps({"kind": "forget", "run_id": "r"})) is None
    compensation = CancelAttempt(run_id="r", step_key="a", attempt=2, round=1, compensation=True)
    assert redis_wire.decode_control(redis_wire.encode_control(compensation)) == compensation


def test_a_cancel_sent_without_a_round_is_round_0_on_nats() -> None:
    old = {"type": "cancel", "run_id": "r", "step_key": "a", "attempt": 2}
    assert nats._control_from(old) == CancelAttempt(run_id="r", step_key="a", attempt=2)
    assert nats._control_from({**old, "round": 4}) == CancelAttempt(
        run_id="r", step_key="a", attempt=2, round=4
    )
    assert nats._control_from({"type": "forget", "run_id": "r"}) is None
    assert nats._control_from({**old, "compensation": True}) == CancelAttempt(
        run_id="r", step_key="a", attempt=2, compensation=True
    )
