"""The plain-number series expose what prometheus-client's own types would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tideflow.observability.series import Counts, Level, Series, Timings

BUCKETS = (0.1, 1.0, 10.0)


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_timings_bucket_like_a_prometheus_histogram_boundaries_included() -> None:
    values = [0.0, 0.1, 0.10001, 1.0, 5.0, 10.0, 11.0]
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    timings = Series(ours).add(Timings("t_seconds", "t", ("k",), BUCKETS))
    reference = Histogram("t_seconds", "t", ("k",), buckets=BUCKETS, registry=theirs)
    for value in values:
        timings.observe(("a",), value)
        reference.labels("a").observe(value)
    assert samples(ours) == samples(theirs)
    assert samples(ours)[("t_seconds_bucket", (("k", "a"), ("le", "0.1")))] == 2


def test_counts_and_levels() -> None:
    registry = CollectorRegistry()
    series = Series(registry)
    runs = series.add(Counts("runs", "r", ("workflow",)))
    series.add(Counts("lonely", "l"))
    running = series.add(Level("running", "now"))
    runs.inc(("a",))
    runs.inc(("a",), 2)
    runs.inc(("b",))
    running.add(3)
    running.add(-1)
    got = samples(registry)
    assert got[("runs_total", (("workflow", "a"),))] == 3
    assert got[("runs_total", (("workflow", "b"),))] == 1
    assert got[("lonely_total", ())] == 0  # a series without labels is there from the start
    assert got[("running", ())] == 2
