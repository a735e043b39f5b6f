"""The event gateway over HTTP: N waiting runs, each woken by its own CloudEvent sent to
``POST /events`` (found by correlation: ``match: signal.data.order_id ==
inputs.order_id``, no ``tideflowrunid``), through a real uvicorn on a free port.

Starts N runs of a workflow that waits for ``com.example.payment.succeeded`` whose
``data.order_id`` is its own, waits until all wait, then sends one event per run
(structured mode, or batches of ``--batch``) from ``--concurrency`` keep-alive connections in
another process (a client's HTTP stack is not the server's cost), authenticated by a
bearer source. Reports the events/s the gateway accepted (202) and
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
import multiprocessing
import socket
import time
from collections.abc import Sequence
from typing import Any

import h11
import orjson
import uvicorn
from scratch import scratch_dir

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
        options["store"] = f"sqlite:///{scratch_dir('tideflow-gw-')}/bench.db"
    sources = EventSources.of(
        {"sources": [{"source": SOURCE, "auth": "bearer", "token_env": "T", "types": ["*"]}]},
        {"T": TOKEN},
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
        async with asyncio.timeout(3600):
            await all_waiting.wait()
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
            cpu_before = time.process_time()
            sent = await send_apart(port, requests(orders, batch), concurrency)
            server_cpu = time.process_time() - cpu_before
            sent_at = time.perf_counter()
            async with asyncio.timeout(3600):
                await all_ended.wait()
            applied = time.perf_counter() - sent_at + sent["seconds"]
        finally:
            server.should_exit = True
            await serving
            listener_sock.close()
        accepted, statuses = sent["seconds"], sent["statuses"]
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
        "server_cpu_ms_per_event": round(server_cpu * 1000 / runs, 3),
        "sender_cpu_ms_per_event": round(sent["cpu_s"] * 1000 / runs, 3),
        "statuses": statuses,
        "woken_by_the_wrong_event": len(wrong),
    }


async def send_apart(port: int, items: list[tuple[str, bytes]], concurrency: int) -> dict[str, Any]:
    """Send ``items`` from another process (the way a client does: its HTTP stack is not
    the server's to pay for) and return how long the sending took and the statuses."""
    parent, child = multiprocessing.get_context("spawn").Pipe()
    sender = multiprocessing.get_context("spawn").Process(
        target=send_all, args=(port, items, concurrency, child), daemon=True
    )
    sender.start()
    try:
        result: dict[str, Any] = await asyncio.to_thread(parent.recv)
    finally:
        await asyncio.to_thread(sender.join, 60)
    if "error" in result:
        raise RuntimeError(f"the sender failed: {result['error']}")
    return result


def send_all(port: int, items: list[tuple[str, bytes]], concurrency: int, conn: Any) -> None:
    """The sender process: ``concurrency`` connections take ``items`` in turn."""
    try:
        conn.send(asyncio.run(_send_all(port, items, concurrency)))
    except Exception as exc:  # reported to the parent, which raises it
        conn.send({"error": repr(exc)})


async def _send_all(port: int, items: list[tuple[str, bytes]], concurrency: int) -> dict[str, Any]:
    """Each of ``concurrency`` keep-alive connections sends its requests one after the
    other. HTTP/1.1 is spoken with h11 (the protocol library under httpx and uvicorn)
    directly: httpx's pool costs ~7 ms of CPU per request here, more than the server."""
    queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()
    for item in items:
        queue.put_nowait(item)
    statuses: dict[str, int] = {}

    async def sender() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        connection = h11.Connection(h11.CLIENT)
        try:
            while not queue.empty():
                content_type, body = queue.get_nowait()
                status, answer = await _post(reader, writer, connection, content_type, body)
                if status != 202:
                    raise RuntimeError(f"POST /events answered {status}: {answer[:300]!r}")
                for outcome in orjson.loads(answer)["events"]:
                    statuses[outcome["status"]] = statuses.get(outcome["status"], 0) + 1
                connection.start_next_cycle()
        finally:
            writer.close()

    began = time.perf_counter()
    await asyncio.gather(*(sender() for _ in range(concurrency)))
    return {
        "seconds": time.perf_counter() - began,
        "cpu_s": time.process_time(),
        "statuses": statuses,
    }


async def _post(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    connection: h11.Connection,
    content_type: str,
    body: bytes,
) -> tuple[int, bytes]:
    headers = [
        ("host", "127.0.0.1"),
        ("content-type", content_type),
        ("content-length", str(len(body))),
        ("authorization", f"Bearer {TOKEN}"),
    ]
    request = h11.Request(method="POST", target="/events", headers=headers)
    writer.write(connection.send(request) + connection.send(h11.Data(data=body)))
    writer.write(connection.send(h11.EndOfMessage()))
    status, chunks = 0, []
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            connection.receive_data(await reader.read(65536))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            chunks.append(bytes(event.data))
        elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
            return status, b"".join(chunks)


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
