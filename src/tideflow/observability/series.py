"""Counters, histograms and gauges kept as plain numbers, turned into Prometheus families
only when scraped.

prometheus-client's own ``Counter`` and ``Histogram`` take a lock and validate the label
values on every ``labels(...).inc()`` and ``observe()``: a few microseconds, several
times per step on the engine's hot path. Everything here is updated from the one event
loop that also serves the scrape, so a dict lookup and an integer add are enough; the
families are built by ``Series.collect`` (a registry collector) at scrape time.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

Key = tuple[str, ...]


class Counts:
    """A counter by label values (``inc(("orders",))``); exposed as ``NAME_total``."""

    def __init__(self, name: str, doc: str, labels: Sequence[str] = ()) -> None:
        self.name, self.doc, self.labels = name, doc, list(labels)
        self.values: dict[Key, float] = {} if labels else {(): 0}  # one series: shown at 0

    def inc(self, key: Key = (), amount: float = 1) -> None:
        self.values[key] = self.values.get(key, 0) + amount

    def family(self) -> Metric:
        family = CounterMetricFamily(self.name, self.doc, labels=self.labels)
        for key, value in self.values.items():
            family.add_metric(list(key), value)
        return family


class Timings:
    """A histogram by label values (``observe(key, seconds)``)."""

    def __init__(
        self, name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]
    ) -> None:
        self.name, self.doc, self.labels = name, doc, list(labels)
        self.bounds = tuple(buckets)
        self.series: dict[Key, list[float]] = {}
        """Per key: the count of each bucket (not cumulative; the last one is +Inf's),
        then the sum."""

    def observe(self, key: Key, value: float) -> None:
        series = self.series.get(key)
        if series is None:
            series = self.of(key)
        series[bisect_left(self.bounds, value)] += 1  # the first bound >= value: `le`
        series[-1] += value

    def of(self, key: Key) -> list[float]:
        """The series of ``key`` (created empty), for a caller that observes into it
        itself: ``series[bisect_left(bounds, value)] += 1; series[-1] += value``."""
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = [0.0] * (len(self.bounds) + 2)
        return series

    def family(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        for key, series in self.series.items():
            buckets: list[tuple[str, float]] = []
            total = 0.0
            for bound, count in zip((*self.bounds, float("inf")), series[:-1], strict=True):
                total += count
                buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), total))
            family.add_metric(list(key), buckets, sum_value=series[-1])
        return family


class Level:
    """A gauge without labels (``value`` set, or moved by ``add``)."""

    def __init__(self, name: str, doc: str) -> None:
        self.name, self.doc = name, doc
        self.value = 0.0

    def add(self, amount: float) -> None:
        self.value += amount

    def family(self) -> Metric:
        family = GaugeMetricFamily(self.name, self.doc)
        family.add_metric([], self.value)
        return family


_Member = TypeVar("_Member", "Counts", "Timings", "Level")


class Series(Collector):
    """The collector of a set of these, registered once in a registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._members: list[Counts | Timings | Level] = []
        registry.register(self)

    def add(self, member: _Member) -> _Member:
        self._members.append(member)
        return member

    def collect(self) -> Iterator[Metric]:
        for member in self._members:
            yield member.family()


__all__ = ["Counts", "Key", "Level", "Series", "Timings"]
