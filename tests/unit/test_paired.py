"""Paired namespaces: option ranges, backlog paths, and the backlog aliases round trip."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import ServiceBusMessage

from georep import (
    ConfigurationError,
    MessageTooLargeError,
    PairedNamespaceOptions,
    backlog_queue_path as path,
)
from georep.adapters.servicebus import from_backlog, to_backlog
from georep.exceptions import InvalidMessageError


def test_defaults_are_the_seeds() -> None:
    options = PairedNamespaceOptions()
    assert options.backlog_queue_count == 10
    assert options.seconds("failover_interval") == 60
    assert options.seconds("ping_primary_interval") == 60
    assert options.seconds("ping_timeout") == 120
    assert options.seconds("syphon_retry_interval") == 1
    assert options.seconds("syphon_long_poll") == 900
    assert (options.syphon_batch_size, options.syphon_prefetch) == (100, 100)
    assert options.seconds("partner_close_timeout") == 5
    assert PairedNamespaceOptions(failover_interval=timedelta(0)).seconds("failover_interval") == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("backlog_queue_count", 0),
        ("failover_interval", 3601),
        ("ping_primary_interval", 0.5),
        ("ping_primary_interval", timedelta(minutes=31)),
        ("syphon_retry_interval", 121),
        ("syphon_retry_interval", 0.5),
    ],
)
def test_out_of_range_options_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=field):
        PairedNamespaceOptions(**{field: value})  # type: ignore[arg-type]


def test_backlog_queue_paths() -> None:
    assert path("contoso-east", 3) == "contoso-east/x-servicebus-transfer/3"
    assert path("contoso-east.servicebus.windows.net", 0) == "contoso-east/x-servicebus-transfer/0"
    assert path("sb://127.0.0.1:5700/", 1) == "127-0-0-1-5700/x-servicebus-transfer/1"


def test_aliases_round_trip() -> None:
    when = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)
    original = ServiceBusMessage(
        b"payload",
        message_id="m-1",
        session_id="s-1",
        time_to_live=timedelta(seconds=90),
        scheduled_enqueue_time_utc=when,
        application_properties={"app": "v"},
    )
    backlog = to_backlog(original, "orders")
    props = backlog.application_properties
    assert props["x-ms-path"] == "orders" and props["x-ms-sessionid"] == "s-1"
    assert props["x-ms-timetolive"] == 90_000
    assert props["x-ms-scheduledenqueuetimeutc"] == when.isoformat()
    assert backlog.session_id is None and backlog.time_to_live is None
    assert backlog.scheduled_enqueue_time_utc is None and backlog.message_id == "m-1"

    destination, restored = from_backlog(backlog)
    assert destination == "orders" and restored.message_id == "m-1"
    assert restored.session_id == "s-1" and restored.time_to_live == timedelta(seconds=90)
    assert restored.scheduled_enqueue_time_utc == when
    assert restored.application_properties == {"app": "v"}
    assert b"".join(restored.body) == b"payload"


def test_a_message_that_no_longer_fits_is_refused_not_truncated() -> None:
    big = ServiceBusMessage(b"x" * 262_000, session_id="s")
    with pytest.raises(MessageTooLargeError, match="no longer fits"):
        to_backlog(big, "a-rather-long-destination-name/with/segments")


def test_a_backlog_message_without_its_path_cannot_be_moved() -> None:
    with pytest.raises(InvalidMessageError, match="x-ms-path"):
        from_backlog(ServiceBusMessage("x"))
