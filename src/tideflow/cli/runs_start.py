"""`tideflow runs start` and `tideflow runs wait`: start a run in a store (a cluster's,
with ``--bus``) and wait for runs to end, without running an engine here.

``wait`` on a cluster (``--bus``) is the client's ``wait``: woken by the run's end,
which the server announces on the bus (runtime/remote.py). Without a bus it reads the
run's summary row from the store, polling with a backoff from 10 ms to 0.5 s (the
store has no channel that announces run ends to a process without an engine).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tideflow.cli.cluster import BusOption, reached
from tideflow.cli.common import (
    DEFAULT_STORE,
    EXIT_FAILED,
    TERMINAL_STATUSES,
    JsonOption,
    RunArgument,
    StoreOption,
    display_url,
    err,
    fail_usage,
    known_run,
    out,
    parse_json_option,
    run_async,
    use_working_directory_modules,
    write_json,
)
from tideflow.cli.remote import ServerOption, TokenOption, check_server
from tideflow.cli.render import print_result

if TYPE_CHECKING:
    from tideflow.client import Client
    from tideflow.model.plan import Priority
    from tideflow.remote_http import HttpClient
    from tideflow.runtime.result import RunResult

TimeoutOption = Annotated[
    float | None,
    typer.Option(
        "--timeout",
        metavar="SECONDS",
        min=0,
        help="Give up waiting after this long (exit 1; the run goes on).",
    ),
]


def start_cmd(
    ctx: typer.Context,
    workflow: Annotated[
        str,
        typer.Argument(
            metavar="FILE|NAME",
            help="A definition file (registered first), or the name of a registered workflow.",
            show_default=False,
        ),
    ],
    input: Annotated[
        str | None, typer.Option("--input", "-i", help="Run input: JSON text, or @file.json.")
    ] = None,
    version: Annotated[
        str | None, typer.Option("--version", help="The version of NAME (default: the latest).")
    ] = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option("--idempotency-key", help="At most one run per key: a reuse returns it."),
    ] = None,
    priority: Annotated[
        str | None,
        typer.Option(
            "--priority",
            metavar="high|normal|low",
            help="The run's place in the queue of runs waiting to be admitted (default: normal): a server keeps --max-active-runs runs active and admits the others high first, then oldest first.",
        ),
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the run to end.")] = False,
    timeout: TimeoutOption = None,
    as_json: JsonOption = False,
    store: StoreOption = DEFAULT_STORE,
    bus: BusOption = None,
    server: ServerOption = None,
    token: TokenOption = None,
) -> None:
    """Start a run and print its id (with --wait: wait for it to end, exit 0 if it succeeded).

    With --bus (or TIDEFLOW_BUS) the run goes to the cluster's `tideflow server`,
    which runs it on its workers; without one it is recorded in the store for the
    engine live on it (or the next `tideflow resume`). `tideflow run FILE` is the
    embedded one-shot instead. --json prints {"run_id", "workflow", "version"},
    or with --wait the run's result.

    Examples:
      tideflow runs start flows/order.yaml --input '{"order_id": "A1"}' --bus redis://mq:6379/0
      tideflow runs start order-fulfillment -i @order.json --wait --json
    """
    from tideflow.errors import TideflowError
    from tideflow.model.run import run_priority
    from tideflow.runtime.definitions import is_python_reference

    check_server(ctx, server)
    try:
        rank = run_priority(priority)
    except TideflowError as exc:
        raise fail_usage(f"--priority: {exc.message}") from None
    value = parse_json_option(input, "--input")
    use_working_directory_modules()
    # over HTTP a definition file is read here and registered first (the server cannot
    # see this machine's files)
    local = Path(workflow).is_file() or is_python_reference(workflow, files_only=True)
    file = workflow if server and local else None
    target = (store, bus, server, token)
    run_id, name, result = run_async(
        _start(target, workflow, file, value, (version, idempotency_key, rank), wait, timeout)
    )
    if result is None and wait:
        err.print(f"run {run_id} had not ended after {timeout:g}s; it goes on", markup=False)
        raise typer.Exit(EXIT_FAILED)
    if result is not None:
        _print(result, as_json)
        return
    if as_json:
        write_json({"run_id": run_id, "workflow": name[0], "version": name[1]})
        return
    out.print(run_id, markup=False)
    remote = server or bus
    where = f"on {display_url(remote)}" if remote else f"in {display_url(store)}"
    err.print(f"started run {run_id} of {name[0]} {name[1]} {where}", markup=False)


async def _start(
    target: tuple[str, str | None, str | None, str | None],
    workflow: str,
    file: str | None,
    value: object,
    how: tuple[str | None, str | None, Priority],
    wait: bool,
    timeout: float | None,
) -> tuple[str, tuple[str, str], RunResult | None]:
    """``how``: the version, the idempotency key and the priority."""
    from tideflow.remote_http import HttpClient

    store, bus, server, token = target
    version, key, priority = how
    async with reached(store, bus, server, token) as client:
        if isinstance(client, HttpClient) and file is not None:
            registered = await client.register_for_start(file)
            workflow, version = registered.name, version or registered.version
        run_id = await client.start(
            workflow, value, version=version, idempotency_key=key, priority=priority
        )
        summary = await client.summary(run_id)
        cluster = bool(bus or server)
        result = await ended(client, run_id, timeout, cluster=cluster) if wait else None
        return run_id, (summary.workflow, summary.version), result


def wait_cmd(
    ctx: typer.Context,
    run_id: RunArgument,
    timeout: TimeoutOption = None,
    as_json: JsonOption = False,
    store: StoreOption = DEFAULT_STORE,
    bus: BusOption = None,
    server: ServerOption = None,
    token: TokenOption = None,
) -> None:
    """Wait for a run to end; print its result; exit 0 if it succeeded, else 1.

    With --bus (or TIDEFLOW_BUS) it wakes when the cluster's server announces the
    run's end on the bus; without one it reads the store until the run has ended.
    --json prints the result as `tideflow run --json` does.

    Examples:
      tideflow runs wait 3f2a9c... --timeout 60
      tideflow runs wait 3f2a9c... --json | jq .status
    """
    check_server(ctx, server)
    result = run_async(_wait(store, bus, server, token, run_id, timeout))
    if result is None:
        err.print(f"run {run_id} had not ended after {timeout:g}s; it goes on", markup=False)
        raise typer.Exit(EXIT_FAILED)
    _print(result, as_json)


async def _wait(
    store: str,
    bus: str | None,
    server: str | None,
    token: str | None,
    run_id: str,
    timeout: float | None,
) -> RunResult | None:
    async with reached(store, bus, server, token) as client:
        await known_run(client, run_id, server or store)
        return await ended(client, run_id, timeout, cluster=bool(bus or server))


async def ended(
    client: Client | HttpClient, run_id: str, timeout: float | None, *, cluster: bool
) -> RunResult | None:
    """The run's result once it has ended (None after ``timeout`` seconds): on a cluster
    the client's ``wait`` (woken by the run's end on the bus; over HTTP it polls the
    server, remote_http.py), else the summary polled
    with a backoff from 10 ms to 0.5 s."""
    import asyncio

    if cluster:
        try:
            return await client.wait(run_id, timeout)
        except TimeoutError:
            return None
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.01
    while (await client.summary(run_id)).status not in TERMINAL_STATUSES:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return None
        await asyncio.sleep(delay if left is None else min(delay, left))
        delay = min(delay * 2, 0.5)
    return await client.get(run_id)


def _print(result: RunResult, as_json: bool) -> None:
    if as_json:
        write_json(result.to_dict())
    else:
        print_result(result)
    if not result.succeeded:
        raise typer.Exit(EXIT_FAILED)


__all__ = ["ended", "start_cmd", "wait_cmd"]
