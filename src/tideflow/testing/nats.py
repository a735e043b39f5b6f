"""Clean up after tests (or a cluster being retired) on a shared NATS server."""

from __future__ import annotations

import contextlib

import nats.js.errors

from tideflow.bus.backends.nats import NatsBus


async def delete_prefix(bus: NatsBus) -> None:
    """Delete the streams (with their consumers), the lock bucket, the readers' and the
    beats' buckets of ``bus.prefix``; ``bus`` must be open."""
    from tideflow.bus.backends.nats_presence import beats_bucket_name, bucket_name

    for stream in (bus.tasks_stream, bus.events_stream, bus.dead_stream):
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await bus.js.delete_stream(stream)
    with contextlib.suppress(nats.js.errors.NotFoundError, nats.js.errors.BucketNotFoundError):
        await bus.js.delete_key_value(bus.lock_bucket)
    for bucket in (bucket_name(bus), beats_bucket_name(bus)):
        with contextlib.suppress(nats.js.errors.NotFoundError, nats.js.errors.BucketNotFoundError):
            await bus.js.delete_key_value(bucket)
