"""Every example in ``examples/`` runs, through the embedded runtime and the CLI.

Each example is run on its success path and on the failure path it exists to
show. Step functions record what they did in module-level lists (the order
ledger, the moderation decisions, the invoice outbox), which is how these tests
see the order of compensations and the number of sends in flight.

Waits are driven by signals and, in the approval example, by a manual clock:
the definition keeps its real 24h/8h timeouts and the test moves time forward.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
if str(ROOT) not in sys.path:  # `examples` is a package at the repository root
    sys.path.insert(0, str(ROOT))

from examples import invoices, moderation, orders  # noqa: E402

from tideflow import RunResult, Runtime, Workflow, compile_definition, validate  # noqa: E402
from tideflow.testing.clock import ManualClock  # noqa: E402
from tideflow.testing.waiting import step_is, wait_until  # noqa: E402

RUN_TIMEOUT = 20.0
HOUR = 3600.0


# --- harness ------------------------------------------------------------------------


@pytest.fixture
async def rt() -> AsyncIterator[Runtime]:
    async with Runtime(definitions_dir=EXAMPLES) as runtime:
        yield runtime


async def until_step(rt: Runtime, run_id: str, key: str, status: str) -> None:
    await wait_until(rt, run_id, step_is(key, status), RUN_TIMEOUT)


async def start(rt: Runtime, example: str, input: Any = None) -> str:
    plan = await rt.register(EXAMPLES / example)
    return await rt.start_run(plan, input)


async def run(rt: Runtime, example: str, input: Any = None) -> RunResult:
    return await rt.wait(await start(rt, example, input), RUN_TIMEOUT)


def statuses(result: RunResult) -> dict[str, str]:
    return {key: step.status for key, step in result.steps.items()}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI from the repository root, on a SQLite store of its own (not ./.tideflow)."""
    store = Path(tempfile.mkdtemp(prefix="tideflow-cli-")) / "runs.db"
    return subprocess.run(
        [sys.executable, "-m", "tideflow.cli.main", *args],
        cwd=ROOT,
        env={**os.environ, "TIDEFLOW_STORE": f"sqlite:///{store}"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# --- every example is a valid definition -----------------------------------------------


def example_files() -> Iterator[Path]:
    return iter(sorted(EXAMPLES.glob("*.yaml")))


@pytest.mark.parametrize("path", list(example_files()), ids=lambda p: p.name)
def test_example_validates_without_errors_or_warnings(path: Path) -> None:
    diagnostics = validate(path.read_text(encoding="utf-8"), file=str(path))
    assert [d.format() for d in diagnostics] == []


def test_every_example_is_covered_here() -> None:
    covered = {
        "approval.yaml",
        "content_moderation.yaml",
        "etl.yaml",
        "map_items.yaml",
        "order_saga.yaml",
        "polling_loop.yaml",
        "scheduled_report.yaml",
    }
    assert {p.name for p in example_files()} == covered


# --- order saga -------------------------------------------------------------------------


async def test_order_saga_ships_an_order(rt: Runtime) -> None:
    result = await run(rt, "order_saga.yaml", {"order_id": "S-ok", "amount": 30})

    assert result.status == "succeeded", result.error
    assert result.output == {
        "order_id": "S-ok",
        "reservation_id": "res-S-ok",
        "charge_id": "ch-S-ok",
        "tracking_number": "TRK-S-ok",
    }
    assert orders.calls_for("S-ok") == ["reserve", "charge", "ship"]


async def test_order_saga_retries_a_flaky_charge_with_one_idempotency_key(rt: Runtime) -> None:
    run_id = await start(
        rt, "order_saga.yaml", {"order_id": "S-flaky", "amount": 12.5, "flaky_charges": 2}
    )
    result = await rt.wait(run_id, RUN_TIMEOUT)

    assert result.status == "succeeded", result.error
    charge = result.steps["charge"]
    assert charge.attempts == 3
    assert charge.output["attempt"] == 3
    assert charge.output["idempotency_key"] == f"{run_id}:charge"
    assert orders.calls_for("S-flaky") == [
        "reserve",
        "charge_timeout",
        "charge_timeout",
        "charge",
        "ship",
    ]


async def test_order_saga_compensates_in_reverse_order_when_shipping_fails(rt: Runtime) -> None:
    stock_before = orders.STOCK["SKU-2"]
    input = {
        "order_id": "A2",
        "amount": 30,
        "fail_shipping": True,
        "items": [{"sku": "SKU-2", "quantity": 2}],
    }
    run_id = await start(rt, "order_saga.yaml", input)
    result = await rt.wait(run_id, RUN_TIMEOUT)

    assert result.status == "compensated"
    assert result.error is not None and result.error["type"] == "AddressRejected"
    assert statuses(result) == {"reserve": "succeeded", "charge": "succeeded", "ship": "failed"}
    # refund (undoes charge) before release (undoes reserve): reverse completion order
    assert orders.calls_for("A2") == ["reserve", "charge", "ship_rejected", "refund", "release"]
    assert orders.STOCK["SKU-2"] == stock_before

    history = await rt.store.history(run_id)
    transitions = [t for entry in history for t in entry.transitions]
    undone = [
        t["subject"]
        for t in transitions
        if t["subject"].endswith(":compensate") and t["new"] == "succeeded"
    ]
    assert undone == ["charge:compensate", "reserve:compensate"]
    run_states = [t["new"] for t in transitions if t["subject"] == "run"]
    assert run_states == ["running", "failed", "compensating", "compensated"]


async def test_order_saga_undoes_only_completed_steps_when_the_charge_gives_up(rt: Runtime) -> None:
    input = {"order_id": "S-down", "amount": 30, "flaky_charges": 10}
    result = await run(rt, "order_saga.yaml", input)

    assert result.status == "compensated"
    assert result.error is not None and result.error["type"] == "PaymentGatewayUnavailable"
    assert result.steps["charge"].status == "failed"
    assert result.steps["charge"].attempts == 4  # retry.max_attempts
    assert result.steps["ship"].status == "cancelled"
    assert orders.calls_for("S-down") == ["reserve"] + ["charge_timeout"] * 4 + ["release"]


def order_saga_in_python() -> Workflow:
    """examples/order_saga.yaml, written with the builder."""
    wf = Workflow(
        "order-saga",
        "1.0.0",
        description="Reserve inventory, charge the payment and ship; undo in reverse order on failure.",
        input={
            "type": "object",
            "required": ["order_id", "amount"],
            "additionalProperties": False,
            "properties": {
                "order_id": {"type": "string", "minLength": 1},
                "amount": {"type": "number", "exclusiveMinimum": 0},
                "items": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["sku", "quantity"],
                        "properties": {
                            "sku": {"type": "string"},
                            "quantity": {"type": "integer", "minimum": 1},
                        },
                    },
                },
                "address": {"type": "string"},
                "fail_shipping": {
                    "type": "boolean",
                    "description": "demo switch, the carrier rejects the address",
                },
                "flaky_charges": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "demo switch, this many charge attempts time out first",
                },
            },
        },
        on_failure="compensate",
        defaults={"timeout": "10s"},
        output={
            "order_id": "{{ inputs.order_id }}",
            "reservation_id": "{{ steps.reserve.output.reservation_id }}",
            "charge_id": "{{ steps.charge.output.charge_id }}",
            "tracking_number": "{{ steps.ship.output.tracking_number }}",
        },
    )
    wf.python(
        "reserve",
        "examples.orders:reserve_inventory",
        input={
            "order_id": "{{ inputs.order_id }}",
            "items": "{{ default(inputs.items, [{'sku': 'SKU-1', 'quantity': 1}]) }}",
        },
        compensate={
            "type": "python",
            "function": "examples.orders:release_inventory",
            "input": {
                "order_id": "{{ inputs.order_id }}",
                "reservation_id": "{{ steps.reserve.output.reservation_id }}",
                "items": "{{ steps.reserve.input.items }}",
            },
        },
    )
    wf.python(
        "charge",
        "examples.orders:charge_payment",
        depends_on=["reserve"],
        input={
            "order_id": "{{ inputs.order_id }}",
            "amount": "{{ inputs.amount }}",
            "flaky_attempts": "{{ default(inputs.flaky_charges, 0) }}",
        },
        retry={
            "max_attempts": 4,
            "backoff": "exponential",
            "initial_delay": "20ms",
            "multiplier": 2,
            "max_delay": "200ms",
            "retry_on": ["ConnectionError"],
        },
        compensate={
            "type": "python",
            "function": "examples.orders:refund_payment",
            "input": {
                "order_id": "{{ inputs.order_id }}",
                "charge_id": "{{ steps.charge.output.charge_id }}",
                "amount": "{{ steps.charge.output.amount }}",
            },
            "retry": {"max_attempts": 3, "backoff": "50ms"},
        },
    )
    wf.python(
        "ship",
        "examples.orders:ship_order",
        depends_on=["charge"],
        input={
            "order_id": "{{ inputs.order_id }}",
            "address": "{{ default(inputs.address, '1 Harbour Road, Portsmouth') }}",
            "reject_address": "{{ default(inputs.fail_shipping, false) }}",
        },
    )
    return wf


async def test_the_builder_reproduces_the_order_saga_plan(rt: Runtime) -> None:
    from_yaml = compile_definition(EXAMPLES / "order_saga.yaml")
    from_code = order_saga_in_python().compile()

    assert from_code.hash == from_yaml.hash
    assert from_code.source == from_yaml.source
    registered = await rt.register(EXAMPLES / "order_saga.yaml")
    assert (await rt.register(order_saga_in_python())).hash == registered.hash


# --- content moderation -----------------------------------------------------------------


def decisions_for(content_id: str) -> list[dict[str, Any]]:
    return [d for d in moderation.DECISIONS if d["content_id"] == content_id]


async def test_moderation_publishes_clean_content_without_review(rt: Runtime) -> None:
    input = {
        "content_id": "m-clean",
        "text": "Lovely photos from the harbour walk",
        "images": ["harbour.jpg"],
    }
    result = await run(rt, "content_moderation.yaml", input)

    assert result.status == "succeeded", result.error
    assert result.output == {
        "content_id": "m-clean",
        "decision": "published",
        "score": 0.0,
        "reviewed_by": None,
        "url": "https://forum.example/posts/m-clean",
    }
    assert result.steps["route"].output == {"case": "default", "next": ["publish"]}
    for skipped in ("review", "verdict", "reject"):
        assert result.steps[skipped].status == "skipped"
    assert [d["action"] for d in decisions_for("m-clean")] == ["published"]


async def test_moderation_rejects_clearly_bad_content_at_once(rt: Runtime) -> None:
    input = {"content_id": "m-bad", "text": "ok", "images": ["cat.png", "nsfw_03.png"]}
    result = await run(rt, "content_moderation.yaml", input)

    assert result.status == "succeeded", result.error
    assert result.output["decision"] == "rejected"
    assert result.steps["route"].output == {"case": 0, "next": ["reject"]}
    assert "looks like 'nsfw'" in result.steps["reject"].output["notice"]
    assert result.steps["review"].status == "skipped"


async def test_moderation_waits_for_a_moderator_who_approves(rt: Runtime) -> None:
    text = "Limited offer on spare sails, click here: http://sails.example"
    run_id = await start(rt, "content_moderation.yaml", {"content_id": "m-border", "text": text})
    await until_step(rt, run_id, "review", "waiting")
    assert (await rt.result(run_id)).steps["combine"].output["score"] == 0.6

    # a decision about another post is not taken by this run's wait (match)
    await rt.signal(
        run_id, "moderation.review", {"content_id": "other", "decision": "reject", "reviewer": "x"}
    )
    decision = {"content_id": "m-border", "decision": "approve", "reviewer": "dana"}
    await rt.signal(run_id, "moderation.review", decision)
    result = await rt.wait(run_id, RUN_TIMEOUT)

    assert result.status == "succeeded", result.error
    assert result.steps["review"].output == decision
    assert result.steps["verdict"].output == {"case": 0, "next": ["publish"]}
    assert result.steps["reject"].status == "skipped"
    assert result.output["decision"] == "published"
    assert result.output["reviewed_by"] == "dana"
    assert decisions_for("m-border") == [
        {"content_id": "m-border", "action": "published", "score": 0.6, "by": "dana"}
    ]


async def test_moderation_waits_for_a_moderator_who_rejects(rt: Runtime) -> None:
    text = "Only an idiot would post this"
    run_id = await start(rt, "content_moderation.yaml", {"content_id": "m-rej", "text": text})
    await until_step(rt, run_id, "review", "waiting")
    await rt.signal(
        run_id,
        "moderation.review",
        {"content_id": "m-rej", "decision": "reject", "reviewer": "eli"},
    )
    result = await rt.wait(run_id, RUN_TIMEOUT)

    assert result.status == "succeeded", result.error
    assert result.steps["verdict"].output == {"case": "default", "next": ["reject"]}
    assert result.steps["publish"].status == "skipped"
    assert result.output["decision"] == "rejected"
    assert result.output["reviewed_by"] == "eli"


# --- approval ---------------------------------------------------------------------------


@pytest.fixture
async def clocked() -> AsyncIterator[tuple[Runtime, ManualClock]]:
    clock = ManualClock()
    async with Runtime(definitions_dir=EXAMPLES, clock=clock) as runtime:
        yield runtime, clock


REQUEST = {"request_id": "R-7", "requester": "sam", "amount": 420}


async def test_approval_approved_by_signal(clocked: tuple[Runtime, ManualClock]) -> None:
    rt, clock = clocked
    run_id = await start(rt, "approval.yaml", REQUEST)
    await until_step(rt, run_id, "approval", "waiting")
    clock.advance(3 * HOUR)  # well inside the 24h
    await rt.signal(run_id, "approval", {"request_id": "R-7", "approved": True, "by": "team-lead"})
    result = await rt.wait(run_id, RUN_TIMEOUT)

    assert result.status == "succeeded", result.error
    assert result.output == {"decision": "approved", "by": "team-lead", "escalated": False}
    for skipped in ("escalate", "escalation", "final", "rejected"):
        assert result.steps[skipped].status == "skipped"


async def test_approval_rejected_by_signal(clocked: tuple[Runtime, ManualClock]) -> None:
    rt, _ = clocked
    run_id = await start(rt, "approval.yaml", REQUEST)
    await until_step(rt, run_id, "approval", "waiting")
    await rt.signal(run_id, "approval", {"request_id": "R-7", "approved": False, "by": "team-lead"})
    result = await rt.wait(run_id, RUN_TIMEOUT)

    assert result.status == "succeeded", result.error
    assert result.output == {"decision": "rejected", "by": "team-lead", "escalated": False}


async def test_approval_escalates_after_the_timeout(clocked: tuple[Runtime, ManualClock]) -> None:
    rt, clock = clocked
    events: list[dict[str, Any]] = []
    rt.add_event_sink(events.append)
    run_id = await start(rt, "approval.yaml", REQUEST)
    await until_step(rt, run_id, "approval", "waiting")

    clock.advance(24 * HOUR)
    await until_step(rt, run_id, "escalation", "waiting")
    progress = await rt.result(run_id)
    assert progress.steps["approval"].output == {"timed_out": True}
    assert progress.steps["route"].output == {"case": 0, "next": ["escalate"]}
    [event] = events
    assert event["type"] == "approval.escalated"
    assert event["id"] == f"{run_id}:escalate"
    assert event["source"] == "tideflow/expense-approval"
    assert event["specversion"] == "1.0"
    assert event["data"] == {
        "request_id": "R-7",
        "requester": "sam",
        "amount": 420,
        "waited_for": "team-lead",
    }

    clock.advance(2 * HOUR)
    await rt.signal(
        run_id, "escalated_approval", {"request_id": "R-7", "approved": True, "by": "manager"}
    )
    result = await rt.wait(run_id, RUN_TIMEOUT)

    assert result.status == "succeeded", result.error
    assert result.output == {"decision": "approved", "by": "manager", "escalated": True}


async def test_approval_fails_when_the_escalation_times_out_too(
    clocked: tuple[Runtime, ManualClock],
) -> None:
    rt, clock = clocked
    run_id = await start(rt, "approval.yaml", REQUEST)
    await until_step(rt, run_id, "approval", "waiting")
    clock.advance(24 * HOUR)
    await until_step(rt, run_id, "escalation", "waiting")
    clock.advance(8 * HOUR)
    result = await rt.wait(run_id, RUN_TIMEOUT)

    assert result.status == "failed"
    assert result.error is not None and result.error["type"] == "SignalTimeout"
    assert result.steps["escalation"].status == "failed"
    assert result.steps["approved"].status != "succeeded"


# --- map over items ---------------------------------------------------------------------


def invoice_batch(*emails: str) -> dict[str, Any]:
    return {
        "batch_id": "B-7",
        "invoices": [
            {"invoice_id": f"I-{i}", "email": email, "amount": 10.0 * (i + 1)}
            for i, email in enumerate(emails)
        ],
    }


async def test_map_sends_three_at_a_time_and_tolerates_one_failure(rt: Runtime) -> None:
    invoices.reset()
    emails = [
        "ada@example.com",
        "ben@example.com",
        "no-at-sign",
        "cy@greylist.example",
        "di@example.com",
        "ed@example.com",
    ]
    result = await run(rt, "map_items.yaml", invoice_batch(*emails))

    assert result.status == "succeeded", result.error
    assert invoices.peak_in_flight() == 3
    outputs = result.steps["send"].output
    assert [o.get("invoice_id") for o in outputs] == ["I-0", "I-1", None, "I-3", "I-4", "I-5"]
    assert outputs[2]["index"] == 2 and outputs[2]["error"]["type"] == "InvalidRecipient"
    assert result.steps["send[2]"].status == "failed"
    assert result.steps["send[2]"].error is not None
    assert result.steps["send[2]"].error["type"] == "InvalidRecipient"
    assert result.steps["send[2]"].attempts == 1  # not in retry_on
    assert result.steps["send[3]"].attempts == 2  # greylisted once, then accepted
    assert result.output == {
        "sent": ["I-0", "I-1", "I-3", "I-4", "I-5"],
        "failed": ["I-2"],
        "amount_sent": 180.0,
    }
    assert len(invoices.OUTBOX) == 5


async def test_map_fails_with_too_many_failures(rt: Runtime) -> None:
    invoices.reset()
    result = await run(
        rt, "map_items.yaml", invoice_batch("nobody", "ada@example.com", "nobody-either")
    )

    assert result.status == "failed"
    assert result.error is not None and result.error["type"] == "TooManyFailures"
    assert result.steps["send"].status == "failed"
    assert result.steps["report"].status != "succeeded"


# --- polling loop -----------------------------------------------------------------------


async def test_loop_polls_until_the_job_is_done(rt: Runtime) -> None:
    result = await run(
        rt, "polling_loop.yaml", {"report": "sales", "period": "2026-03", "polls_needed": 3}
    )

    assert result.status == "succeeded", result.error
    assert result.output["polls"] == 3
    assert result.output["report"]["url"] == "file:///reports/sales-2026-03.csv"
    checks = sorted(key for key in result.steps if key.endswith("/check"))
    assert checks == ["poll@0/check", "poll@1/check", "poll@2/check"]
    assert result.steps["poll@1/check"].output["state"] == "running"
    assert result.steps["poll@1/progress"].output == {"percent": 67, "message": "poll 2: running"}
    assert result.steps["poll"].output == {
        "check": result.steps["poll@2/check"].output,
        "progress": {"percent": 100, "message": "poll 3: done"},
    }


async def test_loop_gives_up_after_max_iterations(rt: Runtime) -> None:
    result = await run(
        rt, "polling_loop.yaml", {"report": "sales", "period": "2026-04", "polls_needed": 20}
    )

    assert result.status == "failed"
    assert result.error is not None and result.error["type"] == "MaxIterationsExceeded"
    assert result.steps["poll"].error is not None
    assert result.steps["poll"].error["type"] == "MaxIterationsExceeded"
    assert len([key for key in result.steps if key.endswith("/check")]) == 8
    assert result.steps["fetch"].status != "succeeded"


# --- etl --------------------------------------------------------------------------------


EXPECTED_ETL_OUTPUT = {
    "rows_loaded": 10,
    "rejected": [
        {"order_id": "O-1005", "problems": ["amount must be positive, got -1500 cents"]},
        {"order_id": "O-1007", "problems": ["unknown customer C-99"]},
    ],
    "quality": 0.833,
    "revenue_by_region_cents": {"amer": 34523, "apac": 10150, "emea": 49893},
}


async def test_etl_runs_without_input(rt: Runtime) -> None:
    result = await run(rt, "etl.yaml")

    assert result.status == "succeeded", result.error
    assert result.output == EXPECTED_ETL_OUTPUT
    assert result.steps["summary"].output["batch"] == f"orders-{result.run_id}"
    assert result.steps["summary"].attempts == 0  # a set step needs no worker


async def test_etl_stops_before_loading_when_data_quality_is_too_low(rt: Runtime) -> None:
    definition = yaml.safe_load((EXAMPLES / "etl.yaml").read_text(encoding="utf-8"))
    definition["version"] = "1.0.0-strict"
    validate_step = next(s for s in definition["steps"] if s["id"] == "validate")
    validate_step["input"]["max_invalid_ratio"] = 0.1
    result = await rt.run(definition)

    assert result.status == "failed"
    assert result.error is not None and result.error["type"] == "DataQualityError"
    assert "2 of 12 records are invalid" in result.error["message"]
    assert result.steps["validate"].attempts == 1  # retry: false
    assert result.steps["load"].status != "succeeded"


def test_cli_runs_the_etl_example_as_json() -> None:
    done = cli("run", "examples/etl.yaml", "--json")

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert set(result) == {"run_id", "status", "output", "error", "steps"}
    assert result["status"] == "succeeded"
    assert result["error"] is None
    assert result["output"] == EXPECTED_ETL_OUTPUT
    assert set(result["steps"]) == {
        "extract_orders",
        "extract_customers",
        "transform",
        "validate",
        "summary",
        "load",
    }
    for step in result["steps"].values():
        assert set(step) == {"status", "attempts", "output", "error"}
        assert step["status"] == "succeeded"


def test_cli_exits_1_when_the_saga_compensates() -> None:
    input = json.dumps({"order_id": "CLI-1", "amount": 30, "fail_shipping": True})
    done = cli("run", "examples/order_saga.yaml", "--input", input, "--json")

    assert done.returncode == 1, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "compensated"
    assert result["error"]["type"] == "AddressRejected"


def test_cli_validates_every_example() -> None:
    done = cli("validate", *sorted(str(p.relative_to(ROOT)) for p in example_files()))

    assert done.returncode == 0, done.stderr
    assert done.stdout.count(": ok") == len(list(example_files()))


# --- python builder ---------------------------------------------------------------------

BUILDER_INPUT = {"name": "Ada", "words": ["tide", "flow"]}
BUILDER_OUTPUT = {"text": "Hello, Ada! You gave 2 words, 8 letters."}


async def test_python_builder_runs_through_the_runtime(rt: Runtime) -> None:
    result = await run(rt, "python_builder.py", BUILDER_INPUT)

    assert result.status == "succeeded", result.error
    assert result.output == BUILDER_OUTPUT
    assert result.steps["shout"].output == {"loud": BUILDER_OUTPUT["text"].upper()}


def test_cli_runs_validates_and_draws_the_python_builder_example() -> None:
    done = cli("run", "examples/python_builder.py", "--input", json.dumps(BUILDER_INPUT), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["output"] == BUILDER_OUTPUT

    done = cli("validate", "examples/python_builder.py", "--strict")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "examples/python_builder.py: ok"

    done = cli("graph", "examples/python_builder.py")
    assert "greet --> report" in done.stdout and "count --> report" in done.stdout

    done = cli("run", "examples/python_builder.py", "--input", '{"name": "Ada"}')
    assert done.returncode == 2  # the input schema requires words


# --- scheduled report ---------------------------------------------------------------------


async def test_the_scheduled_report_runs_every_weekday_morning_and_hourly_on_weekends() -> None:
    """A week on a manual clock, from Monday 4 January 2027 00:00 UTC: five weekday runs
    at 06:00 Paris (05:00 UTC) and the weekend's hourly runs (48 slots from Saturday
    00:00 Paris, Friday 23:00 UTC, to Sunday 23:00 Paris)."""
    from datetime import UTC, datetime

    from tideflow.store.base import RunFilter

    monday = datetime(2027, 1, 4, tzinfo=UTC).timestamp()
    clock = ManualClock(start=monday)
    async with Runtime(clock=clock, schedules=True, sweep_interval=0) as rt:
        assert rt.schedules is not None
        await rt.register(EXAMPLES / "scheduled_report.yaml")
        await rt.schedules.settled()  # the first slot's wake-up is armed
        end = monday + 7 * 24 * HOUR
        while clock.now() < end:  # from one armed timer to the next, as time would go
            upcoming = [t for t in clock.pending() if t > clock.now()]
            clock.advance(min([*upcoming, end]) - clock.now())
            await rt.schedules.settled()
            for run_id in await rt.unfinished():  # each run ends before the next slot
                await rt.wait(run_id, RUN_TIMEOUT)
        page = await rt.client.list(RunFilter(workflow="scheduled-report"), limit=200)
        results = [await rt.wait(r.run_id, RUN_TIMEOUT) for r in page.runs]
    outputs = sorted(str(r.output) for r in results)
    weekdays = [o for o in outputs if o.endswith(".pdf")]
    assert weekdays == [f"sales-2027-01-{d:02d}T05:00:00Z.pdf" for d in range(4, 9)]
    weekend = [o for o in outputs if o.endswith(".csv")]
    assert len(weekend) == 48
    assert weekend[0] == "sales-2027-01-08T23:00:00Z.csv"  # Saturday 00:00 in Paris
    assert all(r.succeeded for r in results)
