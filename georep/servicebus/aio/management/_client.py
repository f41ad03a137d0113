"""The drop-in async ``ServiceBusAdministrationClient`` over two namespaces.

As ``azure.servicebus.aio.management.ServiceBusAdministrationClient``: every create, update
and delete is applied to both namespaces (the paired-namespace guidance: every entity in
both, with the same settings); gets and lists answer with the primary's properties,
annotated with ``georep_regions`` and ``georep_differences`` (see
:mod:`georep.servicebus._admin`). A list is a :class:`Listing`: iterated with ``async for``
as the SDK's ``AsyncItemPaged`` (one page: both namespaces are read whole, then merged), or
awaited for a plain list.
"""

from __future__ import annotations

__all__ = ["Listing", "ServiceBusAdministrationClient"]

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Mapping
from functools import partial
from typing import Any, Generic, TypeVar, cast

from azure.servicebus.aio.management import ServiceBusAdministrationClient as _SdkAdmin
from azure.servicebus.management import (
    NamespaceProperties,
    QueueProperties,
    QueueRuntimeProperties,
    RuleProperties,
    SubscriptionProperties,
    SubscriptionRuntimeProperties,
    TopicProperties,
    TopicRuntimeProperties,
)

from georep._lifecycle import ClosedOnAsyncExit
from georep.exceptions import AllRegionsUnavailableError
from georep.servicebus._admin import REGIONS, TwoNamespaces, changed, merge_listed, read

_T = TypeVar("_T")


class Listing(Generic[_T]):
    """What a ``list_*`` method returns: ``async for item in admin.list_queues():`` as with
    the SDK's ``AsyncItemPaged`` (and ``by_page()``, one page), or ``await`` it for a list.

    Nothing is read until it is iterated or awaited; each iteration reads again.
    """

    def __init__(self, read: Callable[[], Coroutine[Any, Any, list[_T]]]) -> None:
        self._read = read

    def __aiter__(self) -> AsyncIterator[_T]:
        return self._items()

    async def _items(self) -> AsyncIterator[_T]:
        for item in await self._read():
            yield item

    def by_page(self, continuation_token: str | None = None) -> AsyncIterator[AsyncIterator[_T]]:
        """The items as pages, as ``AsyncItemPaged.by_page``: one page holding them all."""
        return self._pages()

    async def _pages(self) -> AsyncIterator[AsyncIterator[_T]]:
        yield self._items()

    def __await__(self) -> Generator[Any, None, list[_T]]:
        return self._read().__await__()


class ServiceBusAdministrationClient(TwoNamespaces, ClosedOnAsyncExit):
    """Manage the entities of two namespaces as one (async).

    Build it with :meth:`from_connection_strings` or :meth:`from_namespaces`.

    Args:
        primary: The primary namespace's SDK administration client (owned by this object).
        secondary: The secondary's.
    """

    _sdk_admin = _SdkAdmin

    def __init__(self, primary: _SdkAdmin, secondary: _SdkAdmin) -> None:
        self._clients = dict(zip(REGIONS, (primary, secondary), strict=True))

    async def close(self) -> None:
        """Close both namespaces' clients."""
        await asyncio.gather(*(c.close() for c in self._clients.values()), return_exceptions=True)

    async def _both(self, operation: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Each region's answer (or error) to ``operation``."""
        answers = await asyncio.gather(
            *(getattr(c, operation)(*args, **kwargs) for c in self._clients.values()),
            return_exceptions=True,
        )
        return dict(zip(self._clients, answers, strict=True))

    async def _change(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        """``operation`` applied in both namespaces; its answer (see :func:`changed`)."""
        return changed(operation, await self._both(operation, *args, **kwargs))

    async def _read(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        """The primary's answer to ``operation``, annotated with both (see :func:`read`)."""
        return read(operation, await self._both(operation, *args, **kwargs))

    def _list(self, operation: str, *args: Any, **kwargs: Any) -> Listing[Any]:
        """``operation``'s items in both namespaces, read when iterated or awaited."""
        return Listing(partial(self._read_list, operation, *args, **kwargs))

    async def _read_list(self, operation: str, *args: Any, **kwargs: Any) -> list[Any]:
        async def listed(client: _SdkAdmin) -> list[Any]:
            return [item async for item in getattr(client, operation)(*args, **kwargs)]

        answers = await asyncio.gather(
            *(listed(c) for c in self._clients.values()), return_exceptions=True
        )
        by_region = dict(zip(self._clients, answers, strict=True))
        answered = {r: a for r, a in by_region.items() if not isinstance(a, BaseException)}
        if not answered:
            errors = {r: a for r, a in by_region.items() if isinstance(a, BaseException)}
            raise AllRegionsUnavailableError(f"no namespace answered {operation}", errors)
        return merge_listed(answered)

    async def create_queue(self, queue_name: str, **kwargs: Any) -> QueueProperties:
        """Create the queue in both namespaces (the SDK's arguments)."""
        return cast(QueueProperties, await self._change("create_queue", queue_name, **kwargs))

    async def get_queue(self, queue_name: str, **kwargs: Any) -> QueueProperties:
        """The queue's properties (the primary's), annotated with both regions'."""
        return cast(QueueProperties, await self._read("get_queue", queue_name, **kwargs))

    async def get_queue_runtime_properties(
        self, queue_name: str, **kwargs: Any
    ) -> QueueRuntimeProperties:
        """The queue's runtime properties (the primary's), annotated with both regions'."""
        return cast(
            QueueRuntimeProperties,
            await self._read("get_queue_runtime_properties", queue_name, **kwargs),
        )

    async def update_queue(self, queue: QueueProperties | Mapping[str, Any], **kwargs: Any) -> None:
        """Apply the same settings to the queue in both namespaces."""
        await self._change("update_queue", queue, **kwargs)

    async def delete_queue(self, queue_name: str, **kwargs: Any) -> None:
        """Delete the queue in both namespaces."""
        await self._change("delete_queue", queue_name, **kwargs)

    def list_queues(self, **kwargs: Any) -> Listing[QueueProperties]:
        """Every queue of either namespace, each annotated with the regions that have it."""
        return self._list("list_queues", **kwargs)

    def list_queues_runtime_properties(self, **kwargs: Any) -> Listing[QueueRuntimeProperties]:
        """Every queue's runtime properties, each annotated with both regions'."""
        return self._list("list_queues_runtime_properties", **kwargs)

    async def create_topic(self, topic_name: str, **kwargs: Any) -> TopicProperties:
        """Create the topic in both namespaces (the SDK's arguments)."""
        return cast(TopicProperties, await self._change("create_topic", topic_name, **kwargs))

    async def get_topic(self, topic_name: str, **kwargs: Any) -> TopicProperties:
        """The topic's properties (the primary's), annotated with both regions'."""
        return cast(TopicProperties, await self._read("get_topic", topic_name, **kwargs))

    async def get_topic_runtime_properties(
        self, topic_name: str, **kwargs: Any
    ) -> TopicRuntimeProperties:
        """The topic's runtime properties (the primary's), annotated with both regions'."""
        return cast(
            TopicRuntimeProperties,
            await self._read("get_topic_runtime_properties", topic_name, **kwargs),
        )

    async def update_topic(self, topic: TopicProperties | Mapping[str, Any], **kwargs: Any) -> None:
        """Apply the same settings to the topic in both namespaces."""
        await self._change("update_topic", topic, **kwargs)

    async def delete_topic(self, topic_name: str, **kwargs: Any) -> None:
        """Delete the topic in both namespaces."""
        await self._change("delete_topic", topic_name, **kwargs)

    def list_topics(self, **kwargs: Any) -> Listing[TopicProperties]:
        """Every topic of either namespace, each annotated with the regions that have it."""
        return self._list("list_topics", **kwargs)

    def list_topics_runtime_properties(self, **kwargs: Any) -> Listing[TopicRuntimeProperties]:
        """Every topic's runtime properties, each annotated with both regions'."""
        return self._list("list_topics_runtime_properties", **kwargs)

    async def create_subscription(
        self, topic_name: str, subscription_name: str, **kwargs: Any
    ) -> SubscriptionProperties:
        """Create the subscription in both namespaces (the SDK's arguments)."""
        return cast(
            SubscriptionProperties,
            await self._change("create_subscription", topic_name, subscription_name, **kwargs),
        )

    async def get_subscription(
        self, topic_name: str, subscription_name: str, **kwargs: Any
    ) -> SubscriptionProperties:
        """The subscription's properties (the primary's), annotated with both regions'."""
        return cast(
            SubscriptionProperties,
            await self._read("get_subscription", topic_name, subscription_name, **kwargs),
        )

    async def get_subscription_runtime_properties(
        self, topic_name: str, subscription_name: str, **kwargs: Any
    ) -> SubscriptionRuntimeProperties:
        """The subscription's runtime properties (the primary's), annotated with both regions'."""
        return cast(
            SubscriptionRuntimeProperties,
            await self._read(
                "get_subscription_runtime_properties", topic_name, subscription_name, **kwargs
            ),
        )

    async def update_subscription(
        self,
        topic_name: str,
        subscription: SubscriptionProperties | Mapping[str, Any],
        **kwargs: Any,
    ) -> None:
        """Apply the same settings to the subscription in both namespaces."""
        await self._change("update_subscription", topic_name, subscription, **kwargs)

    async def delete_subscription(
        self, topic_name: str, subscription_name: str, **kwargs: Any
    ) -> None:
        """Delete the subscription in both namespaces."""
        await self._change("delete_subscription", topic_name, subscription_name, **kwargs)

    def list_subscriptions(self, topic_name: str, **kwargs: Any) -> Listing[SubscriptionProperties]:
        """Every subscription of either namespace, each annotated with the regions that have it."""
        return self._list("list_subscriptions", topic_name, **kwargs)

    def list_subscriptions_runtime_properties(
        self, topic_name: str, **kwargs: Any
    ) -> Listing[SubscriptionRuntimeProperties]:
        """Every subscription's runtime properties, each annotated with both regions'."""
        return self._list("list_subscriptions_runtime_properties", topic_name, **kwargs)

    async def create_rule(
        self, topic_name: str, subscription_name: str, rule_name: str, **kwargs: Any
    ) -> RuleProperties:
        """Create the rule in both namespaces."""
        return cast(
            RuleProperties,
            await self._change("create_rule", topic_name, subscription_name, rule_name, **kwargs),
        )

    async def get_rule(
        self, topic_name: str, subscription_name: str, rule_name: str, **kwargs: Any
    ) -> RuleProperties:
        """The rule's properties (the primary's), annotated with both regions'."""
        return cast(
            RuleProperties,
            await self._read("get_rule", topic_name, subscription_name, rule_name, **kwargs),
        )

    async def update_rule(
        self,
        topic_name: str,
        subscription_name: str,
        rule: RuleProperties | Mapping[str, Any],
        **kwargs: Any,
    ) -> None:
        """Apply the same rule to the subscription in both namespaces."""
        await self._change("update_rule", topic_name, subscription_name, rule, **kwargs)

    async def delete_rule(
        self, topic_name: str, subscription_name: str, rule_name: str, **kwargs: Any
    ) -> None:
        """Delete the rule in both namespaces."""
        await self._change("delete_rule", topic_name, subscription_name, rule_name, **kwargs)

    def list_rules(
        self, topic_name: str, subscription_name: str, **kwargs: Any
    ) -> Listing[RuleProperties]:
        """Every rule of the subscription in either namespace, annotated."""
        return self._list("list_rules", topic_name, subscription_name, **kwargs)

    async def get_namespace_properties(self, **kwargs: Any) -> NamespaceProperties:
        """The primary namespace's properties, annotated with both."""
        return cast(NamespaceProperties, await self._read("get_namespace_properties", **kwargs))
