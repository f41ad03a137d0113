"""Namespaces plus a credential, in every from_... constructor: Microsoft Entra ID tokens (the
emulator's test credential stands in for Entra ID), named keys and SAS tokens, with the
client settings passed through to the SDK."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from _helpers import drain_ids, on_emulator, run_until
from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential
from azure.servicebus import ServiceBusMessage, TransportType

from georep import ConfigurationError, GeoReceiver, GeoSender, sync
from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisSeenSet
from georep.adapters.relay import mint_sas_token
from georep.exceptions import RegionError

pytestmark = pytest.mark.integration


def _named_keys(emu: Emulator, tls: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each region's client options with its own named-key credential."""
    regions = []
    for name in ("primary", "secondary"):
        key = AzureNamedKeyCredential("RootManageSharedAccessKey", emu.namespace(name).key)
        regions.append({**emu.client_options(name, tls=tls), "credential": key})
    return regions[0], regions[1]


def on_namespaces(cls: Any, emu: Emulator, credential: Any, queue: str, **options: Any) -> Any:
    """``cls.from_namespaces`` (a GeoSender, its sync version...) on the emulator's two
    namespaces with ``credential``, for ``queue`` (``tls``: as ``Emulator.client_options``)."""
    tls = options.pop("tls", True)
    primary, secondary = (emu.client_options(name, tls=tls) for name in ("primary", "secondary"))
    return cls.from_namespaces(primary, secondary, credential, queue_name=queue, **options)


async def test_an_entra_id_credential_sends_active_and_receives_once(
    emu: Emulator, private_queue: Callable[..., str], seen: RedisSeenSet
) -> None:
    queue = private_queue("entra")
    credential = emu.async_token_credential("owner")
    primary, secondary = emu.client_options("primary"), emu.client_options("secondary")
    async with GeoSender.from_namespaces(
        primary, secondary, credential, queue_name=queue, mode="active"
    ) as sender:
        results = [await sender.send_messages(ServiceBusMessage(f"m{i}")) for i in range(5)]
    assert all(r.accepted == ("primary", "secondary") for r in results)

    handled: list[str] = []

    async def handle(message: Any) -> None:
        handled.append(str(message.message_id))

    async with GeoReceiver.from_namespaces(
        primary, secondary, credential, queue_name=queue, seen=seen
    ) as receiver:
        await run_until(receiver, handle, lambda: len(handled) >= 5)
    assert sorted(handled) == sorted(r.message_ids[0] for r in results)


async def test_an_expired_or_wrong_audience_token_is_an_auth_error_not_a_failover(
    emu: Emulator, private_queue: Callable[..., str]
) -> None:
    queue = private_queue("entra-bad")
    for credential in (
        emu.async_token_credential(lifetime=-3600),
        emu.async_token_credential(audience="https://storage.azure.com"),
    ):
        async with on_namespaces(GeoSender, emu, credential, queue, tls=False) as sender:
            with pytest.raises(RegionError) as refused:
                await sender.send_messages(ServiceBusMessage(b"x"))
            assert refused.value.kind.value == "authentication", refused.value
            assert "ServiceBusAuthenticationError" in repr(refused.value.__cause__)
    assert emu.namespace("primary").message_count(queue) == 0


async def test_a_receiver_role_may_not_send(
    emu: Emulator, private_queue: Callable[..., str]
) -> None:
    credential = emu.async_token_credential("receiver")
    async with on_namespaces(GeoSender, emu, credential, private_queue("entra-role")) as sender:
        with pytest.raises(RegionError, match="Send"):
            await sender.send_messages(ServiceBusMessage(b"x"))


async def test_named_keys_per_region_and_client_settings_pass_through(
    emu: Emulator, private_queue: Callable[..., str]
) -> None:
    queue = private_queue("named-key")
    primary, secondary = _named_keys(emu)
    async with GeoSender.from_namespaces(
        primary,
        secondary,
        queue_name=queue,
        client_options={"transport_type": TransportType.AmqpOverWebsocket, "retry_total": 0},
    ) as sender:
        config = sender._owned[0].sdk_sender._config
        # The region's own transport_type (AMQP) wins over the shared one; retry_total passes.
        assert (config.transport_type, config.retry_total) == (TransportType.Amqp, 0)
        await sender.send_messages(ServiceBusMessage(b"named"))
    assert len(await drain_ids(emu, "primary", queue)) == 1


async def test_client_options_reach_the_sdk_from_connection_strings_too(
    emu: Emulator, private_queue: Callable[..., str]
) -> None:
    queue = private_queue("options")
    options = {"retry_total": 0, "retry_backoff_max": 0.5}
    async with on_emulator(GeoSender, emu, queue, client_options=options) as sender:
        config = sender._owned[1].sdk_sender._config
        assert (config.retry_total, config.retry_backoff_max) == (0, 0.5)
        await sender.send_messages(ServiceBusMessage(b"x"))


def test_the_sync_api_takes_a_sync_token_credential_and_sas_credentials(
    emu: Emulator, private_queue: Callable[..., str]
) -> None:
    queue = private_queue("sync-entra")
    # A sync TokenCredential, called on a worker thread.
    with on_namespaces(sync.GeoSender, emu, emu.token_credential(), queue) as sender:
        sender.send_messages(ServiceBusMessage(b"sync entra"))
    regions = []
    for name in ("primary", "secondary"):
        port = emu.namespace(name).port
        key = emu.namespace(name).key
        token = mint_sas_token(
            f"sb://127.0.0.1:{port}/", "RootManageSharedAccessKey", key, time.time() + 600
        )
        regions.append(
            {**emu.client_options(name, tls=False), "credential": AzureSasCredential(token)}
        )
    with sync.GeoSender.from_namespaces(regions[0], regions[1], queue_name=queue) as sender:
        sender.send_messages(ServiceBusMessage(b"sync sas"))
    assert asyncio.run(drain_ids(emu, "primary", queue)).total() == 2


def test_a_missing_credential_or_namespace_is_named() -> None:
    with pytest.raises(ConfigurationError, match="needs a credential"):
        GeoSender.from_namespaces("a.servicebus.windows.net", "b", queue_name="q")
    with pytest.raises(ConfigurationError, match="secondary namespace is empty"):
        GeoSender.from_namespaces(
            "a.servicebus.windows.net", "", AzureSasCredential("x"), queue_name="q"
        )
