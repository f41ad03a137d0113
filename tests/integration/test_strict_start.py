"""A GeoSender whose entity exists in one region only, against the emulator (issue 31,
defect 5): the open says what happened in that region, and ``verify_on_open=True``
refuses to start, naming the region and the entity."""

from __future__ import annotations

import gc
import logging
import threading
import uuid

import pytest

import georep.sync
from georep import AuthenticationError, EntityNotFoundError, GeoSender
from georep.adapters.emulator import Emulator

pytestmark = pytest.mark.integration


def only_in_primary(emu: Emulator) -> str:
    name = f"half-{uuid.uuid4().hex[:8]}"
    emu.namespace("primary").create_queue(name)
    return name


def loop_threads() -> list[threading.Thread]:
    """georep's loop thread, if something still uses it. Collected first: a closed
    blocking drop-in client of an earlier test in this worker holds the loop until it is
    garbage-collected (a test's raised exception keeps it in a reference cycle)."""
    gc.collect()
    return [t for t in threading.enumerate() if t.name == "georep-sync-loop"]


async def test_an_entity_missing_in_one_region_is_named_on_open(
    georep_emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    emu = georep_emulator
    queue = only_in_primary(emu)
    primary, secondary = emu.connection_string("primary"), emu.connection_string("secondary")
    caplog.set_level(logging.WARNING, "georep.sender")

    async with GeoSender.from_connection_strings(primary, secondary, queue_name=queue):
        pass
    [line] = [r.getMessage() for r in caplog.records if queue in r.getMessage()]
    assert line.startswith("secondary (127.0.0.1:"), line
    assert f"has no entity {queue!r}" in line and "did not answer" not in line

    strict = GeoSender.from_connection_strings(
        primary, secondary, queue_name=queue, verify_on_open=True
    )
    with pytest.raises(EntityNotFoundError, match=rf"secondary \(.*\) has no entity '{queue}'"):
        await strict.__aenter__()
    assert strict.closed


def test_the_sync_sender_refuses_the_same_and_leaves_no_thread(
    georep_emulator: Emulator,
) -> None:
    emu = georep_emulator
    queue = only_in_primary(emu)
    sender = georep.sync.GeoSender.from_connection_strings(
        emu.connection_string("primary"),
        emu.connection_string("secondary"),
        queue_name=queue,
        verify_on_open=True,
    )
    with pytest.raises(EntityNotFoundError, match=rf"has no entity '{queue}'"), sender:
        pytest.fail("a strict start with a missing entity opened")
    assert loop_threads() == []


async def test_a_wrong_key_is_named_as_refused_credentials(georep_emulator: Emulator) -> None:
    emu = georep_emulator
    queue = f"key-{uuid.uuid4().hex[:8]}"
    for namespace in emu.namespaces:
        emu.namespace(namespace).create_queue(queue)
    primary = emu.connection_string("primary").replace("SharedAccessKey=", "SharedAccessKey=x")
    key = primary.split("SharedAccessKey=")[1].split(";")[0]
    strict = GeoSender.from_connection_strings(
        primary, emu.connection_string("secondary"), queue_name=queue, verify_on_open=True
    )

    with pytest.raises(
        AuthenticationError, match=r"primary \(.*\) refused the credentials"
    ) as info:
        await strict.__aenter__()
    assert key not in str(info.value)
