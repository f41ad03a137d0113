"""How from_... constructors describe a namespace: connection string or credential, and the
client settings that pass through."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from georep._endpoint import NamespaceEndpoint, endpoint_pair, with_client_options
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
