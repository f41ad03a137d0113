"""The drop-in client's construction and arguments (no broker: nothing here connects)."""

from __future__ import annotations

import azure.servicebus
import azure.servicebus.aio
import pytest
from azure.servicebus.exceptions import ServiceBusError

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
    assert "retry_total" in str(raised.value), "names the SDK settings it takes"


@pytest.mark.parametrize("client", [georep.servicebus, georep.servicebus.aio])
def test_the_sdk_clients_own_keywords_are_taken_beside_georeps_for_both_regions(
    client: object,
) -> None:
    """A program written for the SDK passes ``retry_total=``, ``logging_enable=``... to the
    line that makes the client: the one changed line keeps them."""
    made = client.ServiceBusClient.from_connection_strings(  # type: ignore[attr-defined]
        PRIMARY,
        SECONDARY,
        retry_total=2,
        logging_enable=False,
        transport_type=azure.servicebus.TransportType.AmqpOverWebsocket,
        client_options={"user_agent": "shop"},
    )
    core = made if isinstance(made, ServiceBusClient) else made._core
    for target in (core._primary, core._secondary):
        assert dict(target.client_options) == {
            "retry_total": 2,
            "logging_enable": False,
            "transport_type": azure.servicebus.TransportType.AmqpOverWebsocket,
            "user_agent": "shop",
        }
    assert "retry_total" not in core._options


def test_an_sdk_setting_given_twice_with_two_values_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="retry_total given twice"):
        ServiceBusClient.from_connection_strings(
            PRIMARY, SECONDARY, retry_total=2, client_options={"retry_total": 5}
        )
    same = ServiceBusClient.from_connection_strings(
        PRIMARY, SECONDARY, retry_total=2, client_options={"retry_total": 2}
    )
    assert same._primary.client_options["retry_total"] == 2  # type: ignore[union-attr]


def test_one_custom_endpoint_for_both_regions_is_refused_naming_the_per_region_form() -> None:
    with pytest.raises(ConfigurationError, match="one namespace's address") as raised:
        ServiceBusClient.from_connection_strings(
            PRIMARY, SECONDARY, custom_endpoint_address="sb://gateway.example.net"
        )
    assert "NamespaceEndpoint" in str(raised.value)
    # The form it names: one address per region.
    client = georep.servicebus.aio.ServiceBusClient(
        georep.servicebus.aio.NamespaceEndpoint(
            PRIMARY, client_options={"custom_endpoint_address": "sb://gw-east.example.net"}
        ),
        georep.servicebus.NamespaceEndpoint(
            SECONDARY, client_options={"custom_endpoint_address": "sb://gw-west.example.net"}
        ),
        retry_total=1,
    )
    assert [t.client_options for t in (client._primary, client._secondary)] == [  # type: ignore[union-attr]
        {"retry_total": 1, "custom_endpoint_address": "sb://gw-east.example.net"},
        {"retry_total": 1, "custom_endpoint_address": "sb://gw-west.example.net"},
    ]


@pytest.mark.parametrize(
    ("primary", "secondary", "names"),
    [
        ("hello", SECONDARY, "primary connection string has no 'Name=value' parts"),
        ("east.servicebus.windows.net", SECONDARY, "use from_namespaces"),
        ("Endpoint=sb://east.example.net/", SECONDARY, "primary connection string lacks Shared"),
        (PRIMARY, "Endpoint=sb://west.example.net/", "secondary connection string lacks Shared"),
        ("", SECONDARY, "primary connection string is empty"),
        (
            "Endpoint=sb://;SharedAccessKeyName=k;SharedAccessKey=c2VjcmV0",
            SECONDARY,
            "primary connection string's Endpoint names no host",
        ),
        (None, SECONDARY, "primary connection string must be a str, not NoneType"),
        (PRIMARY, b"Endpoint=sb://x/", "secondary connection string must be a str, not bytes"),
    ],
)
@pytest.mark.parametrize("client", [georep.servicebus, georep.servicebus.aio])
def test_a_malformed_connection_string_is_refused_at_construction_as_the_sdks(
    client: object, primary: str, secondary: str, names: str
) -> None:
    """The SDK's from_connection_string raises ValueError at once: so does georep's."""
    with pytest.raises(ValueError, match=names) as raised:
        client.ServiceBusClient.from_connection_strings(primary, secondary)  # type: ignore[attr-defined]
    assert "c2VjcmV0" not in str(raised.value), "never the key"


def test_a_mode_that_is_not_one_is_refused_at_construction_naming_the_choices() -> None:
    with pytest.raises(ConfigurationError, match="mode must be one of 'passive', 'active'"):
        ServiceBusClient.from_connection_strings(PRIMARY, SECONDARY, mode="geo")
    client = ServiceBusClient.from_connection_strings(PRIMARY, SECONDARY, mode="ACTIVE".lower())
    assert client.fully_qualified_namespace == "east.example.net"


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


async def test_a_deferred_number_that_is_not_an_int_is_refused_before_any_call() -> None:
    """The SDK raises a ServiceBusError for it; georep raised a bare TypeError (from its
    number arithmetic) that an SDK program's ``except ServiceBusError`` missed."""
    seen = InMemorySeenSet()
    async with ServiceBusClient.from_connection_strings(PRIMARY, SECONDARY, seen=seen) as client:
        receiver = client.get_queue_receiver("orders")
        with pytest.raises(ServiceBusError, match="a sequence number is an int, got str"):
            await receiver.receive_deferred_messages(["1"])  # type: ignore[list-item]
        await receiver.close()


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


NOT_YET = {"list_queue_sessions", "list_subscription_sessions"}
"""SDK client methods the drop-in client does not offer yet (docs/migration.md §5)."""


def _public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


@pytest.mark.parametrize(
    ("sdk", "dropin"),
    [
        (azure.servicebus.aio.ServiceBusClient, georep.servicebus.aio.ServiceBusClient),
        (azure.servicebus.aio.ServiceBusSender, georep.servicebus.aio._sender.ServiceBusSender),
        (
            azure.servicebus.aio.ServiceBusReceiver,
            georep.servicebus.aio._receiver.ServiceBusReceiver,
        ),
        (azure.servicebus.aio.ServiceBusSession, georep.servicebus.aio._session.GeoSession),
        (azure.servicebus.ServiceBusClient, georep.servicebus.ServiceBusClient),
        (azure.servicebus.ServiceBusSender, georep.servicebus.ServiceBusSender),
        (azure.servicebus.ServiceBusReceiver, georep.servicebus.ServiceBusReceiver),
        (azure.servicebus.ServiceBusSession, georep.servicebus.ServiceBusSession),
    ],
    ids=lambda cls: f"{cls.__module__.split('.')[1]}.{cls.__name__}",
)
def test_every_public_name_of_the_sdks_classes_is_there(sdk: type, dropin: type) -> None:
    # Instance attributes set in __init__ (client_identifier, entity_path...) are checked
    # on live objects by tests/integration/test_dropin_edges.py.
    attributes = {"client_identifier", "entity_path", "entity_name", "fully_qualified_namespace"}
    assert _public(sdk) - _public(dropin) - NOT_YET - attributes == set()


@pytest.mark.parametrize("module", [georep.servicebus, georep.servicebus.aio])
def test_the_sdks_one_namespace_constructor_names_the_two_namespace_one(module: object) -> None:
    with pytest.raises(ValueError, match="from_connection_strings"):
        module.ServiceBusClient.from_connection_string(PRIMARY)  # type: ignore[attr-defined]


def test_a_closed_blocking_client_can_be_used_again_and_keeps_its_resources() -> None:
    """As the SDK's blocking client: after ``with client:`` (or ``close()``) a new sender,
    receiver or ``with`` works; the seen-set it was given stays open while the client
    lives, and is closed once the client and what it made are gone."""
    import gc

    seen = InMemorySeenSet()
    client = georep.servicebus.ServiceBusClient.from_connection_strings(
        PRIMARY, SECONDARY, seen=seen
    )
    with client:
        pass
    client.close()  # idempotent
    with client:
        receiver = client.get_queue_receiver("orders")
        client.get_queue_sender("orders")
    assert not seen.closed
    del client
    gc.collect()
    assert not seen.closed, "a receiver the client made still holds its resources"
    del receiver
    gc.collect()
    assert seen.closed
