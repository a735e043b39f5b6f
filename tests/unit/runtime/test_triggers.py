"""Definitions that runs start from events (``triggers:``), and deactivated versions."""

from __future__ import annotations

import pytest

from tideflow.dsl import compile_definition
from tideflow.errors import DefinitionError, DefinitionInactive
from tideflow.runtime.runtime import Runtime


def fulfil(version: str, **trigger: object) -> dict[str, object]:
    return {
        "name": "fulfil",
        "version": version,
        "input": {"type": "object", "required": ["order"]},
        "triggers": [{"event": "order.paid", **trigger}],
        "steps": [{"id": "a", "type": "noop", "input": {"order": "{{ inputs.order }}"}}],
        "output": "{{ steps.a.output.order }}",
    }


def paid(event_id: str, order: str | None, amount: int = 20) -> dict[str, object]:
    data = {"amount": amount} if order is None else {"order": order, "amount": amount}
    return {
        "specversion": "1.0",
        "id": event_id,
        "source": "shop",
        "type": "order.paid",
        "data": data,
    }


async def test_an_event_starts_one_run_of_the_highest_active_version_once() -> None:
    async with Runtime(workers=1) as rt:
        await rt.client.register(fulfil("1"))
        await rt.client.register(fulfil("2", match="{{ event.data.amount >= 10 }}"))
        (started,) = await rt.client.trigger(paid("e1", "A1"), key="k1")
        assert (started.workflow, started.version, started.created) == ("fulfil", "2", True)
        result = await rt.client.wait(started.run_id, 10)
        assert (result.status, result.output) == ("succeeded", "A1")

        (again,) = await rt.client.trigger(paid("e1", "A1"), key="k1")  # redelivered
        assert (again.run_id, again.created) == (started.run_id, False)
        assert await rt.client.trigger(paid("e2", "A2", amount=5), key="k2") == []
        assert await rt.client.trigger({**paid("e3", "A3"), "type": "order.lost"}, key="k3") == []

        await rt.store.set_definition_active("fulfil", "2", False)
        (older,) = await rt.client.trigger(paid("e4", "A4", amount=5), key="k4")
        assert older.version == "1" and older.created


async def test_an_event_whose_data_the_input_schema_refuses_starts_nothing_and_says_why() -> None:
    async with Runtime(workers=1) as rt:
        await rt.client.register(fulfil("1"))
        (refused,) = await rt.client.trigger(paid("e1", None), key="k1")
        assert refused.run_id is None and not refused.created
        assert "order" in (refused.error or "")
        assert (await rt.client.list()).runs == []


async def test_a_trigger_input_template_reads_the_event() -> None:
    async with Runtime(workers=1) as rt:
        await rt.client.register(fulfil("1", input={"order": "{{ event.source }}-{{ event.id }}"}))
        (started,) = await rt.client.trigger(paid("e9", "ignored"), key="k")
        assert (await rt.client.wait(started.run_id, 10)).output == "shop-e9"


async def test_a_deactivated_version_starts_no_run_by_name_and_runs_of_it_go_on() -> None:
    async with Runtime(workers=1) as rt:
        await rt.client.register(fulfil("1"))
        await rt.client.register(fulfil("2"))
        await rt.store.set_definition_active("fulfil", "2", False)
        with pytest.raises(DefinitionInactive, match=r"fulfil 2 is deactivated"):
            await rt.client.start("fulfil", {"order": "x"}, version="2")
        run_id = await rt.client.start("fulfil", {"order": "x"})
        assert (await rt.client.get(run_id)).version == "1"
        await rt.store.set_definition_active("fulfil", "1", False)
        with pytest.raises(DefinitionInactive, match=r"every version of 'fulfil'"):
            await rt.client.start("fulfil", {"order": "y"})
        assert (await rt.client.wait(run_id, 10)).status == "succeeded"


@pytest.mark.parametrize(
    ("trigger", "says"),
    [
        ({"event": "x", "match": "{{ inputs.a == 1 }}"}, "a trigger reads only `event`"),
        ({"event": "x", "input": {"b": "{{ steps.a.output }}"}}, "a trigger reads only `event`"),
        ({"evnt": "x"}, "did you mean 'event'"),
        ({"event": ""}, "a trigger's event must be an event type"),
    ],
)
def test_a_trigger_that_reads_the_run_or_misnames_a_key_is_refused(trigger, says) -> None:
    definition = {
        "name": "t",
        "version": "1",
        "triggers": [trigger],
        "steps": [{"id": "a", "type": "noop"}],
    }
    with pytest.raises(DefinitionError) as caught:
        compile_definition(definition)
    assert says in str(caught.value)


def test_triggers_change_the_hash_and_a_definition_without_them_keeps_its_own() -> None:
    plain = {"name": "t", "version": "1", "steps": [{"id": "a", "type": "noop"}]}
    with_trigger = {**plain, "triggers": [{"event": "x"}]}
    assert compile_definition(plain).hash != compile_definition(with_trigger).hash
    assert "triggers" not in compile_definition(plain).source
