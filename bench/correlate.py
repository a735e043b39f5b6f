"""Correlated delivery: N runs wait for ``order.paid`` with ``match: signal.data.order_id
== inputs.order_id``; each is woken by its own event through ``Client.deliver_event``.
Reports events/s of the delivery loop (``deliver_all``, reusable by an HTTP variant) and
checks every run finished with exactly its own payload.

Usage:
    python bench/correlate.py --runs 10000 [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tideflow.dsl import compile_definition
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


def event(n: int) -> dict[str, Any]:
    return {"type": "order.paid", "source": "bench", "data": {"order_id": f"o{n}"}}


async def deliver_all(send: Callable[[int], Awaitable[list[str]]], ids: list[str]) -> float:
    """Send event ``n`` for each run ``n`` via ``send``; assert it reached exactly that
    run; return the elapsed seconds."""
    began = time.perf_counter()
    for n, run_id in enumerate(ids):
        sent = await send(n)
        if sent != [run_id]:
            raise SystemExit(f"event {n} went to {sent}, expected [{run_id}]")
    return time.perf_counter() - began


async def main(runs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        store = f"sqlite:///{Path(tmp) / 'store.db'}"
        async with Runtime(store=store, workers=0) as rt:
            ids = [await rt.client.start(ORDER, {"order_id": f"o{n}"}) for n in range(runs)]
            await wait_until(rt, ids[-1], step_is("paid", "waiting"), timeout=600)
            client = rt.client

            async def send(n: int) -> list[str]:
                return await client.deliver_event("order.paid", event(n), event_id=f"e{n}")

            elapsed = await deliver_all(send, ids)
            for n, run_id in enumerate(ids):
                output = (await client.wait(run_id, 600)).output
                if output != {"order_id": f"o{n}"}:
                    raise SystemExit(f"run {run_id} ended with {output!r}")
    return {"runs": runs, "store": "sqlite", "seconds": elapsed, "events_per_s": runs / elapsed}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    row = asyncio.run(main(args.runs))
    if args.json:
        print(json.dumps(row))
    else:
        print(f"{row['runs']} runs, sqlite: {row['events_per_s']:.0f} events/s", file=sys.stdout)
