"""Issue 27: code written for azure-servicebus keeps its ``except`` blocks under georep.

Through the real SDK against the emulator, each failure a georep object raises to its
caller is caught by the ``except <SDK class>`` an application wrote around the SDK's own
call for that failure, by ``except ServiceBusError``, and by georep's class: GeoSender
(async and georep.sync), GeoReceiver and PairedSender.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from _helpers import (
    REDIS_URL,
    backlog_queues,
    eventually,
    fault_all,
    queue_fixture,
    quick_paired_options,
)
from azure.servicebus import ServiceBusMessage
from azure.servicebus.exceptions import (
    MessageAlreadySettled,
    MessageSizeExceededError,
    MessagingEntityNotFoundError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusConnectionError,
    ServiceBusError,
)

import georep
import georep.sync
from georep import FailoverPolicy, GeoReceiver, GeoSender, PairedSender
from georep.adapters.emulator import Emulator
from georep.adapters.redis import RedisSeenSet

pytestmark = pytest.mark.integration

queue = queue_fixture("sdkx")

# Over the 256 KB limit the regions announce: refused before any call once it is known.
KNOWN_OVERSIZE = 300_000
# Under it by its body, over it once encoded: the region refuses the send.
ENCODED_OVERSIZE = 262_100


def wrong_key(connection_string: str) -> str:
    key = dict(p.split("=", 1) for p in connection_string.split(";") if p)["SharedAccessKey"]
    return connection_string.replace(key, base64.b64encode(b"wrong key").decode())


# failure -> (what the SDK raised for it, what georep raises)
FAILURES: dict[str, tuple[type[BaseException], type[georep.GeoReplicationError]]] = {
    "oversize-known": (MessageSizeExceededError, georep.OversizeMessageError),
    "oversize-refused": (MessageSizeExceededError, georep.MessageTooLargeError),
    "batch-full": (MessageSizeExceededError, georep.OversizeMessageError),
    "unknown-entity": (MessagingEntityNotFoundError, georep.EntityNotFoundError),
    "bad-key": (ServiceBusAuthenticationError, georep.CredentialsRefusedError),
    "both-regions-down": (ServiceBusConnectionError, georep.AllRegionsUnavailableError),
}


def sender_arguments(emu: Emulator, queue: str, failure: str) -> tuple[str, str, dict[str, Any]]:
    """Connection strings and options of a GeoSender that will meet ``failure``."""
    primary, secondary = emu.connection_string("primary"), emu.connection_string("secondary")
    options: dict[str, Any] = {
        "queue_name": "no-such-queue" if failure == "unknown-entity" else queue,
        "retry_total": 0,  # the SDK's own retries would only slow the failure down
        "policy": FailoverPolicy(attempt_timeout=3.0),
    }
    return (wrong_key(primary) if failure == "bad-key" else primary), secondary, options


def message_for(failure: str) -> ServiceBusMessage:
    if failure in ("oversize-known", "batch-full"):
        return ServiceBusMessage(b"x" * KNOWN_OVERSIZE)
    if failure == "oversize-refused":
        return ServiceBusMessage(b"x" * ENCODED_OVERSIZE)
    return ServiceBusMessage(f"for {failure}")


def caught_by_every_era(
    error: BaseException, sdk_class: type[BaseException], georep_class: type[BaseException]
) -> None:
    """``error`` is caught by the SDK-era blocks and by georep's (``except`` matches by
    inheritance alone, so raise it into each)."""
    for handler in (sdk_class, ServiceBusError, georep_class, georep.GeoReplicationError):
        try:
            raise error
        except handler:
            pass
    assert type(error) is georep_class


async def sdk_era(call: Callable[[], Awaitable[object]], sdk_class: type[BaseException]) -> Any:
    """Run ``call`` inside the ``except`` an application wrote for the SDK; the error."""
    try:
        await call()
    except sdk_class as error:
        return error
    pytest.fail(f"no {sdk_class.__name__} raised")


@pytest.mark.parametrize("failure", sorted(FAILURES))
async def test_async_geosender_failures_are_caught_as_the_sdks(
    emu: Emulator, queue: str, failure: str
) -> None:
    sdk_class, georep_class = FAILURES[failure]
    primary, secondary, options = sender_arguments(emu, queue, failure)
    message = message_for(failure)
    async with GeoSender.from_connection_strings(primary, secondary, **options) as sender:
        if failure == "oversize-known":
            await sender.warm_up()  # learn the regions' limit
        if failure == "both-regions-down":
            await fault_all(emu, "outage")

        async def call() -> None:
            if failure == "batch-full":
                batch = await sender.create_message_batch()
                batch.add_message(message)
            else:
                await sender.send_messages(message)

        error = await sdk_era(call, sdk_class)
    caught_by_every_era(error, sdk_class, georep_class)
    if isinstance(error, georep.RegionError):
        assert error.inner_exception is error.__cause__
        assert isinstance(error.inner_exception, sdk_class), "the SDK's own error is the cause"


@contextlib.contextmanager
def all_down(emu: Emulator) -> Iterator[None]:
    for namespace in emu.namespaces:
        emu.namespace(namespace).outage()
    try:
        yield
    finally:
        for namespace in emu.namespaces:
            emu.namespace(namespace).restore()


@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_sync_geosender_failures_are_caught_as_the_sdks(
    emu: Emulator, queue: str, failure: str
) -> None:
    sdk_class, georep_class = FAILURES[failure]
    primary, secondary, options = sender_arguments(emu, queue, failure)
    message = message_for(failure)
    error: BaseException | None = None
    with georep.sync.GeoSender.from_connection_strings(primary, secondary, **options) as sender:
        if failure == "oversize-known":
            sender.warm_up()
        with all_down(emu) if failure == "both-regions-down" else contextlib.nullcontext():
            try:
                if failure == "batch-full":
                    sender.create_message_batch().add_message(message)
                else:
                    sender.send_messages(message)
            except sdk_class as raised:  # as the application wrote it for the SDK
                error = raised
    assert error is not None, f"no {sdk_class.__name__} raised"
    caught_by_every_era(error, sdk_class, georep_class)


# ------------------------------------------------------------------------ GeoReceiver


async def test_geo_receiver_peek_of_an_unknown_entity_is_the_sdks_not_found(
    emu: Emulator, seen: RedisSeenSet
) -> None:
    receiver = GeoReceiver.from_connection_strings(
        emu.connection_string("primary"),
        emu.connection_string("secondary"),
        queue_name="no-such-queue",
        seen=seen,
    )
    try:
        error = await sdk_era(lambda: receiver.peek_all(1), MessagingEntityNotFoundError)
    finally:
        await receiver.aclose()
    caught_by_every_era(error, MessagingEntityNotFoundError, georep.EntityNotFoundError)


def test_sync_geo_receiver_peek_of_an_unknown_entity_is_the_sdks_not_found(
    emu: Emulator,
) -> None:
    seen = RedisSeenSet(REDIS_URL, group=f"test-{uuid.uuid4().hex[:8]}")
    error: BaseException | None = None
    with georep.sync.GeoReceiver.from_connection_strings(
        emu.connection_string("primary"),
        emu.connection_string("secondary"),
        queue_name="no-such-queue",
        seen=seen,
    ) as receiver:
        try:
            receiver.peek_all(1)
        except MessagingEntityNotFoundError as raised:
            error = raised
    assert error is not None
    caught_by_every_era(error, MessagingEntityNotFoundError, georep.EntityNotFoundError)


async def test_geo_receiver_second_settlement_is_the_sdks_already_settled(
    emu: Emulator, queue: str, seen: RedisSeenSet
) -> None:
    async with GeoSender.from_connection_strings(
        emu.connection_string("primary"), emu.connection_string("secondary"), queue_name=queue
    ) as sender:
        await sender.send_messages(ServiceBusMessage("settle me twice"))
    errors: list[BaseException] = []
    receiver = GeoReceiver.from_connection_strings(
        emu.connection_string("primary"),
        emu.connection_string("secondary"),
        queue_name=queue,
        seen=seen,
    )

    async def handle(message: Any) -> None:
        await receiver.complete_message(message)
        try:
            await receiver.complete_message(message)
        except MessageAlreadySettled as error:  # the SDK's (a ValueError, not a ServiceBusError)
            errors.append(error)

    async with receiver:
        running = asyncio.create_task(receiver.run(handle))
        assert await eventually(lambda: bool(errors), within=30), "the handler never ran"
        await receiver.aclose()
        await running
    assert len(errors) == 1
    error = errors[0]
    for handler in (MessageAlreadySettled, ValueError, georep.SettlementError):
        try:
            raise error
        except handler:
            pass
    assert type(error) is georep.AlreadySettledError


# ------------------------------------------------------------------------ PairedSender


@contextlib.asynccontextmanager
async def paired_sender(emu: Emulator, queue: str, primary: str) -> AsyncIterator[PairedSender]:
    options = quick_paired_options(2)
    primary_name, _ = await backlog_queues(emu, options, f"sdkx{uuid.uuid4().hex[:6]}")
    async with PairedSender.from_connection_strings(
        primary,
        emu.connection_string("secondary"),
        queue_name=queue,
        primary_namespace=primary_name,
        options=options,
        client_options={"retry_total": 0},
    ) as sender:
        yield sender


async def test_paired_sender_bad_key_is_the_sdks_authentication_error(
    emu: Emulator, queue: str
) -> None:
    async with paired_sender(emu, queue, wrong_key(emu.connection_string("primary"))) as sender:
        error = await sdk_era(
            lambda: sender.send_messages(ServiceBusMessage("m")), ServiceBusAuthenticationError
        )
    caught_by_every_era(error, ServiceBusAuthenticationError, georep.CredentialsRefusedError)
    assert isinstance(error, georep.AuthenticationError)


async def test_paired_sender_with_both_namespaces_down_is_the_sdks_connection_error(
    emu: Emulator, queue: str
) -> None:
    async with paired_sender(emu, queue, emu.connection_string("primary")) as sender:
        await fault_all(emu, "outage")
        error = await sdk_era(
            lambda: sender.send_messages(ServiceBusMessage("m"), timeout=3),
            ServiceBusConnectionError,
        )
    caught_by_every_era(error, ServiceBusConnectionError, georep.AllRegionsUnavailableError)


def refusal_branch(call: Callable[[], Any]) -> str:
    """Which of an SDK program's two ``except`` branches for refused keys ``call`` takes
    (the SDK's classes are siblings: the first that matches wins)."""
    try:
        call()
    except ServiceBusAuthenticationError as error:
        return f"authentication {type(error).__name__}"
    except ServiceBusAuthorizationError as error:
        return f"authorization {type(error).__name__}"
    return "no error"


def test_a_key_without_the_right_takes_the_sdks_authorization_branch(
    emu: Emulator, queue: str
) -> None:
    """A key that lacks the right (a ``ListenOnly`` policy sending, a ``SendOnly`` one
    receiving): the SDK raises ``ServiceBusAuthorizationError``, so does georep (its
    ``AccessDeniedError``, an ``AuthenticationError``); a wrong key is the SDK's
    ``ServiceBusAuthenticationError`` in both. Before, georep's one class was both, and a
    program's first branch took every refusal."""
    import azure.servicebus

    import georep.servicebus

    regions = ("primary", "secondary")

    def raw(rule: str | None) -> Any:
        text = emu.namespace("primary").connection_string_for(rule) if rule else None
        return azure.servicebus.ServiceBusClient.from_connection_string(
            text or wrong_key(emu.connection_string("primary")), retry_total=0
        )

    def dropin(rule: str | None, seen: Any) -> Any:
        texts = [
            emu.namespace(r).connection_string_for(rule)
            if rule
            else wrong_key(emu.connection_string(r))
            for r in regions
        ]
        return georep.servicebus.ServiceBusClient.from_connection_strings(*texts, seen=seen)

    def program(make: Callable[[str | None], Any]) -> list[str]:
        def send(client: Any) -> None:
            with client, client.get_queue_sender(queue) as sender:
                sender.send_messages(ServiceBusMessage("x"))

        def receive(client: Any) -> None:
            with client, client.get_queue_receiver(queue, max_wait_time=2) as receiver:
                receiver.receive_messages(max_wait_time=2)

        return [
            "send, listen key: " + refusal_branch(lambda: send(make("ListenOnly"))),
            "receive, send key: " + refusal_branch(lambda: receive(make("SendOnly"))),
            "send, wrong key: " + refusal_branch(lambda: send(make(None))),
        ]

    raw_lines = program(raw)
    assert [line.split()[-2] for line in raw_lines] == [
        "authorization",
        "authorization",
        "authentication",
    ]
    seen = RedisSeenSet.from_url(REDIS_URL, group=f"sdkx-{uuid.uuid4().hex[:8]}")
    georep_lines = program(lambda rule: dropin(rule, seen))
    assert [line.rsplit(" ", 1)[0] for line in georep_lines] == [
        line.rsplit(" ", 1)[0] for line in raw_lines
    ]
    assert [line.split()[-1] for line in georep_lines] == [
        "AccessDeniedError",
        "AccessDeniedError",
        "CredentialsRefusedError",
    ]
