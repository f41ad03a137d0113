"""The drop-in client's construction and arguments (no broker: nothing here connects)."""

from __future__ import annotations

import azure.servicebus
import azure.servicebus.aio
import pytest

import georep.servicebus
import georep.servicebus.aio
from georep import ConfigurationError
from georep.servicebus.aio import ServiceBusClient, ServiceBusReceiveMode
from georep.testing import InMemorySeenSet

PRIMARY = "Endpoint=sb://east.example.net/;SharedAccessKeyName=k;SharedAccessKey=c2VjcmV0"
SECONDARY = "Endpoint=sb://west.example.net/;SharedAccessKeyName=k;SharedAccessKey=c2VjcmV0"


def test_an_unknown_option_is_refused_by_name() -> None:
    with pytest.raises(ConfigurationError, match="retry_totl") as raised:
        ServiceBusClient.from_connection_strings(PRIMARY, SECONDARY, retry_totl=2)  # type: ignore[call-arg]
    assert "client_options" in str(raised.value)


async def test_receiving_without_a_seen_set_says_what_to_pass() -> None:
    async with ServiceBusClient.from_connection_strings(PRIMARY, SECONDARY) as client:
        with pytest.raises(ConfigurationError, match="seen="):
            client.get_queue_receiver("orders")


async def test_the_sdk_argument_errors_are_value_errors() -> None:
    seen = InMemorySeenSet()
    async with ServiceBusClient.from_connection_strings(PRIMARY, SECONDARY, seen=seen) as client:
        with pytest.raises(ValueError, match="max_wait_time"):
            client.get_queue_receiver("orders", max_wait_time=0)
        renewer = azure.servicebus.aio.AutoLockRenewer()
        with pytest.raises(ValueError, match="RECEIVE_AND_DELETE"):
            client.get_queue_receiver(
                "orders",
                receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE,
                auto_lock_renewer=renewer,
            )
        await renewer.close()


async def test_a_session_receiver_refuses_what_the_sdks_refuses() -> None:
    async with ServiceBusClient.from_connection_strings(
        PRIMARY, SECONDARY, seen=InMemorySeenSet()
    ) as client:
        with pytest.raises(ValueError, match="sub_queue"):
            client.get_queue_receiver(
                "orders", session_id="s1", sub_queue=azure.servicebus.ServiceBusSubQueue.DEAD_LETTER
            )
        receiver = client.get_queue_receiver("orders", session_id="s1")
        with pytest.raises(TypeError, match="session lock"):
            await receiver.renew_message_lock(object())  # type: ignore[arg-type]
        assert receiver.session is None  # not locked until it is opened


async def test_the_client_names_the_primary_namespace_never_the_key() -> None:
    client = ServiceBusClient.from_connection_strings(PRIMARY, SECONDARY)
    assert client.fully_qualified_namespace == "east.example.net"
    await client.close()


@pytest.mark.parametrize(
    ("module", "sdk"),
    [(georep.servicebus, azure.servicebus), (georep.servicebus.aio, azure.servicebus.aio)],
)
def test_the_sdk_names_a_module_imports_with_the_client_are_the_sdks(
    module: object, sdk: object
) -> None:
    for name in ("ServiceBusMessage", "ServiceBusReceiveMode", "ServiceBusSubQueue"):
        assert getattr(module, name) is getattr(azure.servicebus, name)
    assert module.AutoLockRenewer is sdk.AutoLockRenewer  # type: ignore[attr-defined]
    assert module.NEXT_AVAILABLE_SESSION is azure.servicebus.NEXT_AVAILABLE_SESSION  # type: ignore[attr-defined]
