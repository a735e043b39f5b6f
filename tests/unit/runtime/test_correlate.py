"""A signal finds its run among many waiting by correlation (dsl/correlation.py,
runtime/correlate.py): only the runs whose correlated key is the payload's value, and the
waits with no indexed match, are sent it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tideflow.dsl import compile_definition
from tideflow.dsl.correlation import correlation_of
from tideflow.dsl.expr import compile_expression
from tideflow.runtime.runtime import Runtime
from tideflow.testing.waiting import step_is, wait_until

ORDER = compile_definition(
    {
        "name": "order",
        "version": "1",
        "input": {"type": "object", "required": ["order_id"]},
        "steps": [
            {
                "id": "paid",
                "type": "wait",
                "signal": "order.paid",
                "match": "{{ signal.data.order_id == inputs.order_id }}",
            }
        ],
        "output": "{{ steps.paid.output.data }}",
    }
)
ANY = compile_definition(
    {
        "name": "any-payment",
        "version": "1",
        "steps": [{"id": "paid", "type": "wait", "signal": "order.paid"}],
        "output": "{{ steps.paid.output.data }}",
    }
)
EMITTER = compile_definition(
    {
        "name": "emitter",
        "version": "1",
        "steps": [
            {
                "id": "say",
                "type": "emit",
                "event": {"type": "order.paid", "data": {"order_id": "{{ inputs.order_id }}"}},
            }
        ],
    }
)


def paid(order_id: object) -> dict[str, object]:
    return {"type": "order.paid", "source": "shop", "data": {"order_id": order_id}}


@pytest.mark.parametrize(
    ("match", "path", "key"),
    [
        ("{{ signal.data.order_id == inputs.order_id }}", ("data", "order_id"), "inputs.order_id"),
        ('{{ .order_id == signal["data"]["order_id"] and signal.source == "shop" }}',
         ("data", "order_id"), "inputs.order_id"),
        ("{{ signal.n == steps.a.output.n + 1 }}", ("n",), "steps.a.output.n + 1"),
        ("{{ item.id == signal.data.id }}", ("data", "id"), "item.id"),
    ],
)  # fmt: skip
def test_an_equality_on_a_signal_path_is_the_correlation(match, path, key) -> None:
    found = correlation_of(compile_expression(match))
    assert found is not None
    assert (found.path, found.key.source) == (path, key)


@pytest.mark.parametrize(
    "match",
    [
        "{{ signal.amount > 10 }}",
        "{{ signal.a == signal.b }}",
        "{{ signal.a == 1 or signal.b == 2 }}",
        "{{ signal == inputs.x }}",
        "{{ not (signal.a == inputs.x) }}",
    ],
)
def test_other_matches_are_found_by_name(match) -> None:
    assert correlation_of(compile_expression(match)) is None


async def test_each_event_reaches_only_its_run_and_the_unindexed_waits(tmp_path: Path) -> None:
    async with Runtime(store=f"sqlite:///{tmp_path / 'store.db'}", workers=0) as rt:
        ids = {}
        for n in range(200):
            ids[n] = await rt.client.start(ORDER, {"order_id": f"o{n}"})
        catch_all = await rt.client.start(ANY)
        for run_id in [*ids.values(), catch_all]:
            await wait_until(rt, run_id, step_is("paid", "waiting"))
        sent = await rt.client.deliver_event("order.paid", paid("o7"), event_id="e7")
        assert sorted(sent) == sorted([ids[7], catch_all])
        assert (await rt.client.wait(ids[7], 10)).output == {"order_id": "o7"}
        assert (await rt.client.wait(catch_all, 10)).output == {"order_id": "o7"}
        again = await rt.client.deliver_event("order.paid", paid("o7"), event_id="e7")
        assert again == []  # both ended: nothing waits for it any more
        assert await rt.client.deliver_event("order.paid", paid("nobody"), event_id="x") == []
        assert await rt.client.deliver_event("order.paid", {"data": {}}, event_id="y") == []
        for n in range(200):
            if n != 7:
                sent = await rt.client.deliver_event("order.paid", paid(f"o{n}"), event_id=f"e{n}")
                assert sent == [ids[n]]
        for n, run_id in ids.items():
            assert (await rt.client.wait(run_id, 10)).output == {"order_id": f"o{n}"}


async def test_correlation_survives_a_restart_and_numbers_compare_as_json(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    async with Runtime(store=url, workers=0) as rt:
        run_id = await rt.client.start(ORDER, {"order_id": 7})
        await wait_until(rt, run_id, step_is("paid", "waiting"))
    async with Runtime(store=url, workers=0) as rt:
        assert await rt.client.deliver_event("order.paid", paid("7"), event_id="s") == []
        assert await rt.client.deliver_event("order.paid", paid(7.0), event_id="f") == [run_id]
        assert (await rt.client.wait(run_id, 10)).output == {"order_id": 7.0}


async def test_an_emitted_event_reaches_a_correlated_wait() -> None:
    async with Runtime(workers=1) as rt:
        waiting = await rt.client.start(ORDER, {"order_id": "A"})
        other = await rt.client.start(ORDER, {"order_id": "B"})
        await wait_until(rt, waiting, step_is("paid", "waiting"))
        await wait_until(rt, other, step_is("paid", "waiting"))
        await rt.wait(await rt.client.start(EMITTER, {"order_id": "A"}), timeout=10)
        assert (await rt.client.wait(waiting, 10)).output == {"order_id": "A"}
        assert (await rt.client.get(other)).status == "running"


@pytest.mark.slow
async def test_ten_thousand_waiting_runs_each_woken_by_its_own_event(tmp_path: Path) -> None:
    # every run waits for its event at once: parked, none holds an admission slot
    store = f"sqlite:///{tmp_path / 'store.db'}"
    async with Runtime(store=store, workers=0) as rt:
        ids = [await rt.client.start(ORDER, {"order_id": f"o{n}"}) for n in range(10_000)]
        await wait_until(rt, ids[-1], step_is("paid", "waiting"), timeout=120)
        for n, run_id in enumerate(ids):
            sent = await rt.client.deliver_event("order.paid", paid(f"o{n}"), event_id=f"e{n}")
            assert sent == [run_id]
        for n, run_id in enumerate(ids):
            assert (await rt.client.wait(run_id, 60)).output == {"order_id": f"o{n}"}
