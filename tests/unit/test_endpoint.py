"""How from_... constructors describe a namespace: connection string or credential, and the
client settings that pass through."""

from __future__ import annotations

import asyncio
import threading
import traceback
from typing import Any

import pytest

from georep._endpoint import (
    NamespaceEndpoint,
    check_entity_names,
    endpoint_pair,
    with_client_options,
)
from georep.exceptions import ConfigurationError


class _SyncToken:
    """A sync TokenCredential that records the thread it is called on."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    def get_token(self, *scopes: str, **kwargs: Any) -> tuple[str, int]:
        self.threads.append(threading.get_ident())
        return ("token", 0)


def test_client_options_wrap_a_connection_string_and_never_show_it() -> None:
    assert with_client_options("Endpoint=sb://x/;SharedAccessKey=k", None) == (
        "Endpoint=sb://x/;SharedAccessKey=k"
    )
    wrapped = with_client_options("Endpoint=sb://x/;SharedAccessKey=k", {"retry_total": 0})
    assert isinstance(wrapped, NamespaceEndpoint)
    assert wrapped.connection_string == "Endpoint=sb://x/;SharedAccessKey=k"
    assert wrapped.client_options == {"retry_total": 0}
    assert "SharedAccessKey" not in repr(wrapped)


def test_region_options_and_credentials_win_over_shared_ones() -> None:
    shared, own = object(), object()
    primary, secondary = endpoint_pair(
        {"fully_qualified_namespace": "a.servicebus.windows.net", "credential": own,
         "transport_type": "websocket"},
        "b.servicebus.windows.net",
        shared,
        {"transport_type": "amqp", "retry_total": 0},
    )  # fmt: skip
    assert primary.credential is own and secondary.credential is shared
    assert primary.client_options == {
        "fully_qualified_namespace": "a.servicebus.windows.net",
        "transport_type": "websocket",
        "retry_total": 0,
    }
    assert secondary.client_options["transport_type"] == "amqp"
    assert repr(primary) == "NamespaceEndpoint('a.servicebus.windows.net')"


def test_a_sync_token_credential_is_called_off_the_event_loop() -> None:
    credential = _SyncToken()
    primary, _ = endpoint_pair("a", "b", credential, None)

    async def fetch() -> Any:
        return await primary.credential.get_token("https://servicebus.azure.net/.default")

    assert asyncio.run(fetch()) == ("token", 0)
    assert credential.threads and credential.threads[0] != threading.get_ident()


def test_missing_credential_or_namespace_are_named() -> None:
    with pytest.raises(ConfigurationError, match="needs a credential"):
        endpoint_pair("a", "b", None, None)
    with pytest.raises(ConfigurationError, match="primary namespace is empty"):
        endpoint_pair({"transport_type": "amqp"}, "b", object(), None)


KEY_IN_NAME = "Endpoint=sb://east.example.net/;SharedAccessKeyName=k;SharedAccessKey=c2VjcmV0S2V5"


@pytest.mark.parametrize(
    ("names", "says"),
    [
        ({"queue_name": KEY_IN_NAME}, "queue_name= (a connection string?)"),
        ({"topic_name": "bad name;x"}, "topic_name= 'bad name;x' is not"),
        ({"subscription_name": "-starts-badly"}, "subscription_name= '-starts-badly'"),
        ({"queue_name": "q" * 261}, "at most 260"),
        ({"queue_name": 7}, "queue_name= must be the entity's name (a str), not int"),
    ],
)
def test_an_impossible_entity_name_is_refused_without_echoing_a_key(
    names: dict[str, Any], says: str
) -> None:
    """A connection string passed as the entity's name went to the SDK, whose error for
    it (chained to georep's) carried the key into every printed traceback."""
    with pytest.raises(ConfigurationError) as raised:
        check_entity_names(**names)
    assert says in str(raised.value)
    assert "c2VjcmV0S2V5" not in str(raised.value)


def test_every_kind_of_entity_name_service_bus_has_is_taken() -> None:
    check_entity_names(
        queue_name="orders.v2_eu-west",
        topic_name="events",
        subscription_name="audit",
    )
    check_entity_names(queue_name="events/Subscriptions/audit/$DeadLetterQueue")
    check_entity_names(queue_name="q" * 260, topic_name=None)


async def test_a_sender_given_a_connection_string_as_its_queue_keeps_the_key_out() -> None:
    from georep import GeoSender

    with pytest.raises(ConfigurationError) as raised:
        GeoSender.from_connection_strings(KEY_IN_NAME, KEY_IN_NAME, queue_name=KEY_IN_NAME)
    chain = "".join(traceback.format_exception(raised.value))
    assert "c2VjcmV0S2V5" not in chain


async def test_a_connection_string_whose_entity_path_names_another_entity_is_refused() -> None:
    """The SDK raises a plain ValueError for it, which reached the caller as it was: not
    georep's ConfigurationError, and naming nothing to fix."""
    from georep import GeoReceiver, GeoSender
    from georep.testing import InMemorySeenSet

    conn = KEY_IN_NAME.replace("c2VjcmV0S2V5", "a2V5") + ";EntityPath=invoices"
    other = KEY_IN_NAME.replace("east", "west")
    with pytest.raises(ConfigurationError, match="primary connection string's EntityPath"):
        GeoSender.from_connection_strings(conn, other, queue_name="orders")
    with pytest.raises(ConfigurationError, match="remove EntityPath"):
        GeoReceiver.from_connection_strings(
            other, conn, queue_name="orders", seen=InMemorySeenSet()
        )
    taken = GeoSender.from_connection_strings(conn, other, queue_name="invoices")
    await taken.aclose()  # the entity it names: taken (nothing connects before a send)
