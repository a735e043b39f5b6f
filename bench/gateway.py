"""The event gateway over HTTP: N waiting runs, each woken by its own CloudEvent sent to
``POST /events`` (found by correlation: ``match: signal.data.order_id ==
inputs.order_id``, no ``tideflowrunid``), through a real uvicorn on a free port.

Starts N runs of a workflow that waits for ``com.example.payment.succeeded`` whose
``data.order_id`` is its own, waits until all wait, then sends one event per run
(structured mode, or batches of ``--batch``) from ``--concurrency`` httpx connections,
authenticated by a bearer source. Reports the events/s the gateway accepted (202) and
the events/s until every run had ended, and checks that every run ended with its own
event (its output's ``data.order_id`` is its input's).

Usage:
    python bench/gateway.py --runs 10000 --concurrency 16
    python bench/gateway.py --runs 10000 --batch 100 --store sqlite
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import httpx
import orjson
import uvicorn

from tideflow.api import create_app
from tideflow.api.event_sources import EventSources
from tideflow.model.events import Transition
from tideflow.model.run import RunState
from tideflow.runtime.runtime import Runtime

PAID = "com.example.payment.succeeded"
SOURCE = "https://pay.example.com/webhooks"
TOKEN = "bench-token-0123456789abcdef"
ORDER: dict[str, Any] = {
    "name": "order",
    "version": "1",
    "input": {"type": "object", "required": ["order_id"]},
    "steps": [
        {
            "id": "paid",
            "type": "wait",
            "signal": PAID,
            "match": "{{ signal.data.order_id == inputs.order_id }}",
        }
    ],
    "output": "{{ steps.paid.output }}",
}


def event(order_id: str) -> dict[str, Any]:
    return {
        "specversion": "1.0",
        "id": f"pay-{order_id}",
        "source": SOURCE,
        "type": PAID,
        "data": {"order_id": order_id, "amount": 10},
    }


def requests(orders: list[str], batch: int) -> list[tuple[str, bytes]]:
    if batch <= 1:
        return [("application/cloudevents+json", orjson.dumps(event(o))) for o in orders]
    return [
        ("application/cloudevents-batch+json", orjson.dumps([event(o) for o in chunk]))
        for chunk in (orders[i : i + batch] for i in range(0, len(orders), batch))
    ]


async def bench(runs: int, concurrency: int, batch: int, store: str | None) -> dict[str, Any]:
    options: dict[str, Any] = {"workers": 1}
    if store == "sqlite":
        options["store"] = f"sqlite:///{tempfile.mkdtemp(prefix='tideflow-gw-')}/bench.db"
    sources = EventSources.of(
        {"sources": [{"source": SOURCE, "auth": "bearer", "token_env": "T"}]}, {"T": TOKEN}
    )
    async with Runtime(**options) as rt:
        await rt.client.register(ORDER)
        orders = [f"o-{i:06d}" for i in range(runs)]
        began = time.perf_counter()
        run_of = {o: await rt.client.start("order", {"order_id": o}) for o in orders}
        ended: dict[str, Any] = {}
        all_ended = asyncio.Event()
        waiting: set[str] = set()
        all_waiting = asyncio.Event()

        def listener(state: RunState, transitions: Sequence[Transition]) -> None:
            if any(t.subject == "paid" and t.new == "waiting" for t in transitions):
                waiting.add(state.run_id)
                if len(waiting) == runs:
                    all_waiting.set()
            if state.is_terminal:
                ended[state.run_id] = state.output
                if len(ended) == runs:
                    all_ended.set()

        rt.add_listener(listener)
        for run_id in run_of.values():
            step = (await rt.state(run_id)).steps.get("paid")  # None: not started yet
            if step is not None and step.status.value == "waiting":
                waiting.add(run_id)
        if len(waiting) == runs:
            all_waiting.set()
        await asyncio.wait_for(all_waiting.wait(), 3600)
        started = time.perf_counter() - began

        listener_sock = socket.socket()
        listener_sock.bind(("127.0.0.1", 0))
        listener_sock.listen(1024)
        port = listener_sock.getsockname()[1]
        app = create_app(rt.client, event_sources=sources)
        server = uvicorn.Server(
            uvicorn.Config(app, log_config=None, lifespan="off", access_log=False)
        )
        serving = asyncio.create_task(server.serve(sockets=[listener_sock]))
        try:
            queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()
            for item in requests(orders, batch):
                queue.put_nowait(item)
            statuses: dict[str, int] = {}
            limits = httpx.Limits(max_connections=concurrency)
            base = f"http://127.0.0.1:{port}"
            async with httpx.AsyncClient(base_url=base, limits=limits, timeout=600) as api:

                async def sender() -> None:
                    while not queue.empty():
                        content_type, body = queue.get_nowait()
                        headers = {"content-type": content_type, "authorization": f"Bearer {TOKEN}"}
                        answer = await api.post("/events", content=body, headers=headers)
                        answer.raise_for_status()
                        for outcome in answer.json()["events"]:
                            statuses[outcome["status"]] = statuses.get(outcome["status"], 0) + 1

                sent_at = time.perf_counter()
                await asyncio.gather(*(sender() for _ in range(concurrency)))
                accepted = time.perf_counter() - sent_at
                await asyncio.wait_for(all_ended.wait(), 3600)
                applied = time.perf_counter() - sent_at
        finally:
            server.should_exit = True
            await serving
            listener_sock.close()
        wrong = [
            o
            for o, r in run_of.items()
            if (ended.get(r) or {}).get("data", {}).get("order_id") != o
        ]
    return {
        "runs": runs,
        "store": store or "memory",
        "batch": batch,
        "concurrency": concurrency,
        "start_and_wait_s": round(started, 1),
        "accepted_s": round(accepted, 2),
        "accepted_events_per_s": round(runs / accepted, 1),
        "all_ended_s": round(applied, 2),
        "ended_events_per_s": round(runs / applied, 1),
        "statuses": statuses,
        "woken_by_the_wrong_event": len(wrong),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=16, help="connections sending at once")
    parser.add_argument("--batch", type=int, default=1, help="events per request (1: structured)")
    parser.add_argument("--store", choices=["memory", "sqlite"], default="memory")
    args = parser.parse_args(argv)
    store = None if args.store == "memory" else args.store
    row = asyncio.run(bench(args.runs, args.concurrency, args.batch, store))
    print(json.dumps(row))
    return 0 if row["woken_by_the_wrong_event"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
