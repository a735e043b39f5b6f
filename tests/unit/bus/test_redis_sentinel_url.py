"""``redis+sentinel://`` bus URLs: the sentinels, the master's name, the database, the
data nodes' credentials and the options, and what is refused, with why."""

from __future__ import annotations

import pytest

from tideflow.bus import open_bus
from tideflow.bus.backends.redis import RedisBus
from tideflow.bus.backends.redis_sentinel import SentinelTarget
from tideflow.errors import BusError


def opened(url: str) -> RedisBus:
    bus = open_bus(url)
    assert isinstance(bus, RedisBus)
    return bus


@pytest.mark.parametrize(
    ("url", "target"),
    [
        (
            "redis+sentinel://s1:26379,s2:26380,s3/mymaster",
            SentinelTarget((("s1", 26379), ("s2", 26380), ("s3", 26379)), "mymaster", 0),
        ),
        (
            "redis+sentinel://10.0.0.1:5000/orders/3",
            SentinelTarget((("10.0.0.1", 5000),), "orders", 3),
        ),
        (
            "redis+sentinel://app:p%40ss@s1:26379,s2:26379/mymaster/0",
            SentinelTarget((("s1", 26379), ("s2", 26379)), "mymaster", 0, "app", "p@ss"),
        ),
        (
            "redis+sentinel://:secret@[::1]:26379/m",
            SentinelTarget((("::1", 26379),), "m", 0, None, "secret"),
        ),
    ],
)
def test_the_sentinels_the_master_name_and_the_database(url: str, target: SentinelTarget) -> None:
    bus = opened(url)
    assert bus.sentinel == target
    assert bus.wait == 0


def test_the_options_are_the_redis_buses_and_wait() -> None:
    bus = opened(
        "redis+sentinel://s1,s2/m/1?prefix=orders&partitions=8&lease=5&wait=1&wait_timeout=0.25"
    )
    assert (bus.prefix, bus.partitions, bus.lease) == ("orders", 8, 5.0)
    assert (bus.wait, bus.wait_ms) == (1, 250)
    assert bus.sentinel is not None and bus.sentinel.db == 1


def test_the_password_is_not_shown() -> None:
    bus = opened("redis+sentinel://app:hunter2@s1:26379/m")
    assert "hunter2" not in bus.shown
    assert bus.shown == "redis+sentinel://app:***@s1:26379/m"


def test_wait_on_a_plain_redis_url() -> None:
    bus = opened("redis://h:6379/0?wait=2&wait_timeout=3")
    assert bus.sentinel is None
    assert (bus.wait, bus.wait_ms) == (2, 3000)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis+sentinel://s1:26379", "name the master after the sentinels"),
        ("redis+sentinel://s1:26379/", "name the master after the sentinels"),
        ("redis+sentinel://s1:26379/m/0/x", r"the path is /<master-name>\[/<db>\]"),
        ("redis+sentinel://s1:26379/m/zero", "the database after the master name is a number"),
        ("redis+sentinel://s1:26379,,s2/m", "an empty sentinel address"),
        ("redis+sentinel://s1:port/m", "the port of sentinel 's1:port' is not a port number"),
        ("redis+sentinel://s1:70000/m", "is not a port number"),
        ("redis+sentinel://:1/m", "a sentinel address without a host"),
        ("redis+sentinel://s1/m?wait=one", "wait='one' is not a number"),
        ("redis+sentinel://s1/m?wait=-1", "wait must be a whole number of replicas"),
        ("redis+sentinel://s1/m?wait_timeout=0", "wait_timeout must be a positive number"),
        ("redis+sentinel://s1/m?master=m", "unknown option 'master'"),
        ("redis+sentinel://s1/m#x", "no #fragment"),
    ],
)
def test_what_is_refused(url: str, why: str) -> None:
    with pytest.raises(BusError, match=why):
        open_bus(url)
