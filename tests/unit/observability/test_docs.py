"""docs/observability.md and the Grafana dashboard agree with the metrics that exist: every
metric is documented, and every metric the dashboard or an alert queries is one."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from tideflow.observability.metrics import EngineMetrics, WorkerMetrics
from tideflow.runtime.runtime import Runtime

DOCS = Path(__file__).resolve().parents[3] / "docs"
PAGE = DOCS / "observability.md"
DASHBOARD = DOCS / "grafana" / "tideflow.json"
NAME = re.compile(r"\btideflow_[a-z_]+\b")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def families(registry: CollectorRegistry) -> dict[str, str]:
    """Metric name -> type, for everything the registry can expose (labelled or not)."""
    return {
        family.name: family.type
        for family in registry.collect()
        if family.name.startswith("tideflow_")
    }


async def _exposed() -> dict[str, str]:
    async with Runtime(workers=0) as rt:  # the levels read at scrape time are there too
        engine, worker = EngineMetrics().attach(rt), WorkerMetrics().watch(rt.bus)
        await engine.refresh()
        await worker.refresh()
    return {**families(engine.registry), **families(worker.registry)}


def exposed() -> dict[str, str]:
    return asyncio.run(_exposed())


def queryable(names: dict[str, str]) -> set[str]:
    """The series names a query may use."""
    return {name + suffix for name, kind in names.items() for suffix in SUFFIXES[kind]}


def documented() -> set[str]:
    rows = [line for line in PAGE.read_text().splitlines() if line.startswith("| `tideflow_")]
    return {name for row in rows for name in NAME.findall(row.split("|")[1])}


def test_every_metric_is_documented_and_nothing_else() -> None:
    written = {
        name + SUFFIXES[kind][0] if kind == "counter" else name for name, kind in exposed().items()
    }
    assert documented() == written


def test_the_dashboard_queries_only_metrics_that_exist_and_shows_each_one() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    used = {name for expr in exprs for name in NAME.findall(expr)}
    names = exposed()
    assert used <= queryable(names), used - queryable(names)
    shown = {name for name in names if any(n.startswith(name) for n in used)}
    assert shown == set(names), set(names) - shown


def test_the_alert_suggestions_query_only_metrics_that_exist() -> None:
    alerts = PAGE.read_text().split("### Alerts to start from", 1)[1].split("## ", 1)[0]
    exprs, names = NAME.findall(alerts), queryable(exposed())
    assert exprs and set(exprs) <= names, set(exprs) - names
