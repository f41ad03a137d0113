"""Every duration, count and flag of every policy/options object is validated up front.

``FailoverPolicy(attempt_timeout=nan)`` used to be accepted: a NaN deadline expires at
once, so a healthy-but-slow primary was failed over (and the roles swapped) on every send.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from georep import (
    ConfigurationError,
    Corroboration,
    DrainPolicy,
    FailoverPolicy,
    GeoReceiver,
    GeoSender,
    PairedNamespaceOptions,
    RoleState,
)
from georep.relay.channel import RelayPolicy
from georep.testing import FakeClock, FakeMessage, InMemoryRegionReceiver, InMemoryRegionSender
from georep.testing._seen import InMemorySeenSet

NAN = float("nan")
INF = float("inf")

FAILOVER_DURATIONS = [
    "attempt_timeout",
    "switch_back_probe_interval",
    "failback_after",
    "region_cooldown",
]
DRAIN_DURATIONS = ["initial_backoff", "max_backoff", "lease", "idle_interval"]
RELAY_DURATIONS = ["attempt_timeout", "request_timeout"]
PAIRED_DURATIONS = [
    "failover_interval",
    "ping_primary_interval",
    "ping_timeout",
    "syphon_retry_interval",
    "syphon_long_poll",
    "partner_close_timeout",
]
PAIRED_COUNTS = ["backlog_queue_count", "syphon_batch_size", "syphon_prefetch"]

DURATION_CASES = [
    (cls, field, bad)
    for cls, fields in (
        (FailoverPolicy, FAILOVER_DURATIONS),
        (DrainPolicy, DRAIN_DURATIONS),
        (RelayPolicy, RELAY_DURATIONS),
        (PairedNamespaceOptions, PAIRED_DURATIONS),
        (Corroboration, ["window"]),
    )
    for field in fields
    for bad in (NAN, INF, -INF, -1.0, "3", None, True, timedelta(seconds=-1))
]


@pytest.mark.parametrize(("cls", "field", "bad"), DURATION_CASES)
def test_bad_durations_are_refused_naming_the_field(cls: Any, field: str, bad: object) -> None:
    with pytest.raises(ConfigurationError, match=rf"{cls.__name__}\.{field}"):
        cls(**{field: bad})


ZERO_REFUSED = [
    (FailoverPolicy, "attempt_timeout"),
    (FailoverPolicy, "switch_back_probe_interval"),
    (FailoverPolicy, "failback_after"),
    *((DrainPolicy, field) for field in DRAIN_DURATIONS),
    *((RelayPolicy, field) for field in RELAY_DURATIONS),
    (PairedNamespaceOptions, "ping_timeout"),
    (Corroboration, "window"),
    (Corroboration, "reached_within"),
]


@pytest.mark.parametrize(("cls", "field"), ZERO_REFUSED)
def test_zero_is_refused_where_a_wait_must_happen(cls: Any, field: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"{cls.__name__}\.{field}"):
        cls(**{field: 0})


COUNT_CASES = [
    (cls, field, bad)
    for cls, fields in (
        (DrainPolicy, ["batch_size"]),
        (PairedNamespaceOptions, PAIRED_COUNTS),
        (Corroboration, ["reports"]),
    )
    for field in fields
    for bad in (2.5, 1.5, 2.0, True, "3", None, 0, -1)
]


@pytest.mark.parametrize(("cls", "field", "bad"), COUNT_CASES)
def test_counts_must_be_whole_positive_ints(cls: Any, field: str, bad: object) -> None:
    with pytest.raises(ConfigurationError, match=rf"{cls.__name__}\.{field}"):
        cls(**{field: bad})


@pytest.mark.parametrize(
    ("cls", "field"),
    [
        (FailoverPolicy, "switch_back"),
        (PairedNamespaceOptions, "enable_syphon"),
        (Corroboration, "reached"),
    ],
)
@pytest.mark.parametrize("bad", ["false", 0, None])
def test_flags_must_be_bools(cls: Any, field: str, bad: object) -> None:
    with pytest.raises(ConfigurationError, match=rf"{cls.__name__}\.{field}"):
        cls(**{field: bad})


@pytest.mark.parametrize("cls", [FailoverPolicy, RelayPolicy])
@pytest.mark.parametrize("bad", ["timeout", {"no-such-kind"}, 5])
def test_unknown_failover_kinds_are_refused(cls: Any, bad: object) -> None:
    with pytest.raises(ConfigurationError, match=rf"{cls.__name__}\.fail_over_on"):
        cls(fail_over_on=bad)


@pytest.mark.parametrize("bad", [None, True, {"reports": 2}])
def test_corroboration_must_be_a_corroboration(bad: object) -> None:
    with pytest.raises(ConfigurationError, match=r"FailoverPolicy\.corroboration"):
        FailoverPolicy(corroboration=bad)  # type: ignore[arg-type]


def test_good_values_are_kept_as_seconds() -> None:
    policy = FailoverPolicy(attempt_timeout=timedelta(seconds=2), region_cooldown=0)
    assert policy.attempt_seconds == 2.0
    assert policy.region_cooldown_seconds == 0.0
    options = PairedNamespaceOptions(backlog_queue_count=3, failover_interval=0)
    assert options.backlog_queue_count == 3
    assert options.seconds("failover_interval") == 0.0
    assert DrainPolicy(batch_size=7, lease=timedelta(minutes=1)).lease == 60.0
    assert RelayPolicy(request_timeout=1).request_timeout == 1.0
    rule = Corroboration(reached_within=timedelta(minutes=5), reports=2, window=10)
    assert (rule.reached_within, rule.window_seconds) == (300.0, 10.0)
    assert rule.describe() == "reached within 300 s, 2 processes within 10 s"


@pytest.mark.parametrize("bad", [NAN, INF, 0, -1, "1"])
async def test_send_timeout_is_validated(bad: object) -> None:
    primary = InMemoryRegionSender("primary", "east")
    sender = GeoSender(
        primary, InMemoryRegionSender("secondary", "west"), role_state=RoleState("east")
    )
    with pytest.raises(ConfigurationError, match="timeout"):
        await sender.send_messages(FakeMessage(b"x"), timeout=bad)  # type: ignore[arg-type]
    assert primary.accepted == []
    await sender.aclose()


@pytest.mark.parametrize("field", ["lease", "max_wait"])
@pytest.mark.parametrize("bad", [NAN, INF, -1.0, 0.0])
def test_receiver_durations_are_validated(field: str, bad: float) -> None:
    """0 too: the SDK refuses a receive that may not wait, so ``max_wait=0`` received
    nothing and logged a wrong request for ever."""
    clock = FakeClock()
    with pytest.raises(ConfigurationError, match=field):
        GeoReceiver(
            InMemoryRegionReceiver("primary", "east", clock=clock),
            InMemoryRegionReceiver("secondary", "west", clock=clock),
            seen=InMemorySeenSet(clock=clock),
            clock=clock,
            **{field: bad},
        )


def test_a_drain_backoff_that_starts_over_its_bound_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"initial_backoff .* is over max_backoff"):
        DrainPolicy(initial_backoff=10, max_backoff=1)
    assert DrainPolicy(initial_backoff=1, max_backoff=1).backoff(5) == 1.0
