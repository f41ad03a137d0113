"""A refused connection is a region down at once (issue 30): the send that meets it is
classified CONNECTION and fails over, and no connection attempt rebuilds TLS state.

The SDK builds a new TLS context and loads the whole CA bundle on every connection attempt
unless the client is given one; a refused connection paid that twice (the attempt and the
SDK's retry), tens of milliseconds of CPU each, and failed over slower than a dropped one.
The time itself is measured by ``benchmarks/sender.py``, not asserted here.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Iterator

import pytest
from _helpers import fault, queue_fixture
from azure.servicebus import ServiceBusMessage

from georep import ErrorKind, GeoSender, RegionError, RoleState
from georep.adapters.emulator import Emulator
from georep.adapters.servicebus import open_region_sender

pytestmark = pytest.mark.integration

queue = queue_fixture("refused")


@contextlib.contextmanager
def tls_contexts_built() -> Iterator[list[ssl.SSLContext]]:
    """Every ``ssl.SSLContext`` constructed in the block (the SDK's transport calls
    ``ssl.SSLContext(...)`` through the ``ssl`` module)."""
    built: list[ssl.SSLContext] = []
    real = ssl.SSLContext

    class Counted(real):  # type: ignore[misc, valid-type]
        def __new__(cls, *args: object, **kwargs: object) -> ssl.SSLContext:
            context = real.__new__(real, *args, **kwargs)
            built.append(context)
            return context

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ssl, "SSLContext", Counted)
        yield built


async def test_a_refused_connect_fails_over_without_building_tls_state(
    emu: Emulator, queue: str
) -> None:
    primary = open_region_sender(
        emu.connection_string("primary"), region="primary", queue_name=queue
    )
    secondary = open_region_sender(
        emu.connection_string("secondary"), region="secondary", queue_name=queue
    )
    try:
        await primary.send(ServiceBusMessage(b"warm"), timeout=10)
        await secondary.send(ServiceBusMessage(b"warm"), timeout=10)
        await fault(emu, "primary", "outage")
        # The first send after the outage notices the dropped connection; from here on,
        # every send to the primary meets a refused connection.
        with contextlib.suppress(RegionError):
            await primary.send(ServiceBusMessage(b"x"), timeout=10)

        with tls_contexts_built() as built:
            with pytest.raises(RegionError) as refused:
                await primary.send(ServiceBusMessage(b"x"), timeout=10)
            sender = GeoSender(primary, secondary, role_state=RoleState(primary.namespace))
            result = await sender.send_messages(ServiceBusMessage(b"fails over"))
            await sender.aclose()

        assert refused.value.kind is ErrorKind.CONNECTION
        assert "refused" in str(refused.value).lower() or "111" in str(refused.value)
        assert result.failed_over and result.accepted == ("secondary",)
        assert built == [], "a connection attempt built a TLS context of its own"
    finally:
        await fault(emu, "primary", "restore")
        await primary.close()
        await secondary.close()
