"""Sync senders share roles through a role store, as async ones do."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest
from _helpers import LOADED, REDIS_URL
from azure.servicebus import ServiceBusMessage

from georep import sync
from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisRoleStore

pytestmark = pytest.mark.integration


def test_a_failover_seen_by_one_sync_sender_moves_the_other(
    emu: Emulator, private_queue: Callable[..., str]
) -> None:
    queue = private_queue("sync-roles")
    store = RedisRoleStore.from_url(
        REDIS_URL, app=f"sync-{uuid.uuid4().hex[:8]}", operation_timeout=LOADED
    )
    regions = (emu.connection_string("primary"), emu.connection_string("secondary"))
    with (
        sync.GeoSender.from_connection_strings(*regions, queue_name=queue, role_store=store) as a,
        sync.GeoSender.from_connection_strings(*regions, queue_name=queue, role_store=store) as b,
    ):
        assert (a.active_region, b.active_region) == ("primary", "primary")
        emu.namespace("primary").outage()
        result = a.send_messages(ServiceBusMessage("seen by a"))
        assert result.failed_over and result.accepted == ("secondary",)
        deadline = time.monotonic() + 5
        while b.active_region != "secondary" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert b.active_region == "secondary", "b did not follow the shared roles"
        # b sends to the secondary at once, without meeting the primary's outage first.
        assert not b.send_messages(ServiceBusMessage("sent by b")).failed_over
