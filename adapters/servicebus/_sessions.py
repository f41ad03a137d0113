"""The session ports on the async azure-servicebus SDK: accept sessions, receive from one.

:class:`ServiceBusRegionSessions` is one region's session-enabled queue or subscription
(:class:`georep.ports.RegionSessions`); each session it accepts is a
:class:`ServiceBusSessionReceiver` (:class:`georep.ports.SessionReceiver`): the SDK's
session receiver, which georep created and closes (closing releases the session).
"""

from __future__ import annotations

__all__ = ["ServiceBusRegionSessions", "ServiceBusSessionReceiver", "open_region_sessions"]

import asyncio
import contextlib
from datetime import datetime
from typing import Any

from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusMessageState, ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient, ServiceBusReceiver
from azure.servicebus.exceptions import OperationTimeoutError, SessionCannotBeLockedError

from georep._endpoint import check_entity_names
from georep._region_identity import RegionLabels
from georep.exceptions import ConfigurationError, GeoReplicationError

from ._errors import translate_error
from ._receiver import ServiceBusRegionReceiver
from ._region import close_without_keep_alive_wait
from ._sender import open_client

_PEEK_FOR_EMPTY = 32
_CLOSE_SECONDS = 5.0
"""Seconds closing a session receiver whose accept was given up on may take."""
"""Messages browsed to tell an empty session from a slow receive."""


class ServiceBusSessionReceiver(ServiceBusRegionReceiver):
    """One locked session: an SDK session receiver georep opened (and closes).

    ``renew_lock(message)`` renews the session's lock: a session's messages are locked as
    long as their session (the SDK reports no lock of their own).
    """

    def __init__(self, receiver: ServiceBusReceiver, *, region: str) -> None:
        super().__init__(receiver, region=region)
        self._link_open = True  # accepted: the link is open and the session locked
        session = receiver.session
        self._session = session
        self._session_id = str(session.session_id)

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def locked_until(self) -> float | None:
        """When the session's lock expires (epoch seconds), if known."""
        expiry = self._session.locked_until_utc
        return None if expiry is None else expiry.timestamp()

    def _locked_until(self, message: Any) -> Any:
        return self._session.locked_until_utc

    async def renew_lock(self, message: Any) -> float | None:
        try:
            expiry = await self._session.renew_lock()
        except GeoReplicationError:
            raise  # georep's own error (a closed adapter, a lost lock): as it is
        except Exception as exc:
            raise self._translate(exc) from exc
        return expiry.timestamp() if expiry is not None else None

    async def has_messages(self) -> bool:
        # Browsing sees what a receive may not have been handed yet; deferred and
        # scheduled messages are there too but no receive takes them now.
        peeked = await self.peek(_PEEK_FOR_EMPTY)
        return any(m.state == ServiceBusMessageState.ACTIVE for m in peeked)

    async def get_state(self) -> bytes | None:
        state = await self._call(self._session.get_state)
        return None if state is None else bytes(state)

    async def set_state(self, state: bytes | None) -> None:
        await self._call(lambda: self._session.set_state(state))

    async def close(self) -> None:
        await self._receiver.close()


class ServiceBusRegionSessions(RegionLabels):
    """One region's session-enabled queue or subscription, on an SDK client.

    Args:
        client: The region's client; closed by :meth:`close` only if ``owns_client``.
        region: The region's label.
        queue_name: The queue, or None with ``topic_name`` and ``subscription_name``.
        topic_name: The topic.
        subscription_name: The subscription.
        owns_client: georep created ``client`` (closed with this object).
    """

    def __init__(
        self,
        client: ServiceBusClient,
        *,
        region: str,
        queue_name: str | None = None,
        topic_name: str | None = None,
        subscription_name: str | None = None,
        owns_client: bool = False,
    ) -> None:
        if (queue_name is None) == (topic_name is None) or (
            topic_name is not None and subscription_name is None
        ):
            raise ConfigurationError(
                "name a queue (queue_name=) or a topic and subscription "
                "(topic_name=, subscription_name=)"
            )
        super().__init__(
            region,
            str(client.fully_qualified_namespace),
            str(queue_name)
            if queue_name is not None
            else f"{topic_name}/Subscriptions/{subscription_name}",
        )
        self._client = client
        self._queue = queue_name
        self._topic = topic_name
        self._subscription = subscription_name
        self._owns_client = owns_client

    def _session_receiver(self, session_id: str | None, max_wait: float) -> ServiceBusReceiver:
        options: dict[str, Any] = {
            "session_id": NEXT_AVAILABLE_SESSION if session_id is None else session_id,
            "max_wait_time": max_wait,
            "receive_mode": ServiceBusReceiveMode.PEEK_LOCK,
            "prefetch_count": 0,
        }
        if self._queue is not None:
            return self._client.get_queue_receiver(self._queue, **options)
        return self._client.get_subscription_receiver(
            str(self._topic), str(self._subscription), **options
        )

    async def accept(
        self, session_id: str | None, *, max_wait: float
    ) -> ServiceBusSessionReceiver | None:
        receiver = close_without_keep_alive_wait(self._session_receiver(session_id, max_wait))
        try:
            await receiver.__aenter__()
        except (OperationTimeoutError, SessionCannotBeLockedError):
            # No session free within max_wait, or the named one is held by someone else.
            with contextlib.suppress(Exception):
                await receiver.close()
            return None
        except Exception as exc:
            with contextlib.suppress(Exception):
                await receiver.close()
            translated = translate_error(exc, region=self._region, namespace=self._namespace)
            raise (translated or exc) from exc
        except asyncio.CancelledError:
            # The caller gave up waiting (another region found a session first): a link
            # still opening must not go on to lock a session nobody reads.
            # cancellation: the caller's own is raised again below, once the link is closed
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(receiver.close()), _CLOSE_SECONDS)
            raise
        return ServiceBusSessionReceiver(receiver, region=self._region)

    async def list_sessions(
        self, *, state_updated_after: datetime | None = None, timeout: float | None = None
    ) -> list[str]:
        """The session ids the SDK lists for the entity (every page), as the SDK's
        ``list_queue_sessions`` / ``list_subscription_sessions`` take the arguments."""
        if self._queue is not None:
            paged = self._client.list_queue_sessions(
                self._queue, state_updated_after=state_updated_after, timeout=timeout
            )
        else:
            paged = self._client.list_subscription_sessions(
                str(self._topic),
                str(self._subscription),
                state_updated_after=state_updated_after,
                timeout=timeout,
            )
        try:
            return [session_id async for session_id in paged]
        except Exception as exc:
            translated = translate_error(exc, region=self._region, namespace=self._namespace)
            raise (translated or exc) from exc

    async def close(self) -> None:
        if self._owns_client:
            await self._client.close()


def open_region_sessions(
    connection_string: str,
    *,
    region: str,
    queue_name: str | None = None,
    topic_name: str | None = None,
    subscription_name: str | None = None,
    retry_total: int = 1,
    retry_backoff_factor: float = 0.01,
    **client_kwargs: Any,
) -> ServiceBusRegionSessions:
    """Create a client for one region's session entity, owned by the result.

    Raises:
        ConfigurationError: The connection string is malformed (the message never shows
            it), or the entity is not named properly.
    """
    check_entity_names(
        queue_name=queue_name, topic_name=topic_name, subscription_name=subscription_name
    )
    client = open_client(
        connection_string,
        region=region,
        retry_total=retry_total,
        retry_backoff_factor=retry_backoff_factor,
        **client_kwargs,
    )
    return ServiceBusRegionSessions(
        client,
        region=region,
        queue_name=queue_name,
        topic_name=topic_name,
        subscription_name=subscription_name,
        owns_client=True,
    )
