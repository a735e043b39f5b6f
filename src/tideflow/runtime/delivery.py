"""How a client in another process gets an event (signal, cancel, retry) to a run.

The one seam between "deliver to the live engine" and "record for the next one":

- an engine is live on the store (it holds the engine lease): the event goes into the
  store's inbox and the engine is notified (runtime/inbox.py); it applies it within
  milliseconds and carries out what it unlocks;
- a cluster's servers are live on the store (runtime/partitions.py): refused, naming
  them; a cluster client goes through the bus instead (runtime/remote.py);
- no engine is live: this process takes the lease for a moment, applies the event to
  the run and commits it — the run's status is current at once — but relays nothing
  and runs no step: the tasks, timers and outbox entries it produced are carried out
  by the next engine's recovery (`tideflow resume`, `tideflow run`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from tideflow.errors import EngineUnreachable
from tideflow.model.events import Event
from tideflow.runtime.inbox import post
from tideflow.runtime.lease import CLIENT, StoreLease, cluster_members, served_by_cluster
from tideflow.store.base import Lease, Store

Record = Callable[[Sequence[Event]], Awaitable[None]]
"""Commit events to their runs without relaying what they produce."""


async def deliver(store: Store, events: Sequence[Event], record: Record) -> Lease | None:
    """Deliver ``events`` from a process with no engine of its own: the live engine's lease
    when they went to it, None when they were recorded here (with ``record``)."""
    lease = StoreLease(store, kind=CLIENT)
    engine = await lease.acquire()
    if engine is None:
        try:
            servers = await cluster_members(store)
            if servers:  # the runs' owners read the bus, not this store's inbox
                raise EngineUnreachable(served_by_cluster(servers))
            await record(events)
        finally:
            await lease.release()
        return None
    return await post(store, list(events)) or engine


__all__ = ["deliver"]
