"""The drop-in ``ServiceBusAdministrationClient`` over two namespaces (blocking).

As ``azure.servicebus.management.ServiceBusAdministrationClient``: every create, update
and delete is applied to both namespaces (the paired-namespace guidance: every entity in
both, with the same settings); gets and lists answer with the primary's properties,
annotated with ``georep_regions`` and ``georep_differences`` (see
:mod:`georep.servicebus._admin`). A list is read whole and returned as a :class:`Paged`:
a list that also pages, as the SDK's ``ItemPaged`` does (``by_page()``: one page).

There is no second implementation: every call drives the async client
(:mod:`georep.servicebus.aio.management`) on georep's event-loop thread
(:data:`georep._sync_runtime.RUNTIME`, as :mod:`georep.servicebus._sync` does for the
messaging client), and the async client calls the sync SDK clients on worker threads.
"""

from __future__ import annotations

__all__ = ["Paged", "ServiceBusAdministrationClient"]

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from functools import partial
from typing import Any, TypeVar, cast

from azure.servicebus import management as sdk

from georep._lifecycle import ClosedOnExit
from georep._sync_runtime import RUNTIME, LoopUser
from georep.exceptions import ClosedError
from georep.servicebus._admin import TwoNamespaces
from georep.servicebus.aio.management import ServiceBusAdministrationClient as _AsyncAdmin
from georep.servicebus.aio.management._client import Listing

_T = TypeVar("_T")


class _OnWorkerThread:
    """A sync SDK administration client answering as the async SDK's does: each call runs
    on a worker thread (a list is read whole there, then handed out item by item)."""

    def __init__(self, client: sdk.ServiceBusAdministrationClient) -> None:
        self._client = client

    def __getattr__(self, operation: str) -> Callable[..., Any]:
        call = getattr(self._client, operation)
        if operation.startswith("list_"):
            return partial(_listed, call)
        return partial(asyncio.to_thread, call)


async def _listed(call: Callable[..., Any], *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
    for item in await asyncio.to_thread(lambda: list(call(*args, **kwargs))):
        yield item


class Paged(list[_T]):
    """What a ``list_*`` method returns: the items, read whole. Iterated, indexed and
    counted as a list; paged as the SDK's ``ItemPaged``: ``by_page()`` yields one page
    holding every item."""

    def by_page(self, continuation_token: str | None = None) -> Iterator[Iterator[_T]]:
        """The items as pages, as ``ItemPaged.by_page``: one page (the whole list)."""
        return iter([iter(self)])


async def _whole(listing: Listing[_T]) -> Paged[_T]:
    """A listing of the async client, read whole (on georep's loop)."""
    return Paged(await listing)


class ServiceBusAdministrationClient(TwoNamespaces, ClosedOnExit):
    """Manage the entities of two namespaces as one (blocking): the operations, answers
    and errors of :class:`georep.servicebus.aio.management.ServiceBusAdministrationClient`,
    built the same way (``from_connection_strings``, ``from_namespaces``), over the sync
    SDK's clients (``primary`` and ``secondary``, owned by this object)."""

    _sdk_admin = sdk.ServiceBusAdministrationClient

    def __init__(
        self,
        primary: sdk.ServiceBusAdministrationClient,
        secondary: sdk.ServiceBusAdministrationClient,
    ) -> None:
        # The async client calls only what the SDK's clients have (through the thread).
        self._use = LoopUser()
        self._core = self._use.build(
            lambda: _AsyncAdmin(
                cast(Any, _OnWorkerThread(primary)), cast(Any, _OnWorkerThread(secondary))
            )
        )

    def close(self) -> None:
        """Close both namespaces' clients. Idempotent."""
        self._use.close(self._core.close)

    def _call(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        if self._use.closed:
            coroutine.close()
            raise ClosedError("this ServiceBusAdministrationClient is closed; create a new one")
        return RUNTIME.call(coroutine)

    def create_queue(self, queue_name: str, **kwargs: Any) -> sdk.QueueProperties:
        """Create the queue in both namespaces (the SDK's arguments)."""
        return self._call(self._core.create_queue(queue_name, **kwargs))

    def get_queue(self, queue_name: str, **kwargs: Any) -> sdk.QueueProperties:
        """The queue's properties (the primary's), annotated with both regions'."""
        return self._call(self._core.get_queue(queue_name, **kwargs))

    def get_queue_runtime_properties(
        self, queue_name: str, **kwargs: Any
    ) -> sdk.QueueRuntimeProperties:
        """The queue's runtime properties (the primary's), annotated with both regions'."""
        return self._call(self._core.get_queue_runtime_properties(queue_name, **kwargs))

    def update_queue(self, queue: sdk.QueueProperties | Mapping[str, Any], **kwargs: Any) -> None:
        """Apply the same settings to the queue in both namespaces."""
        self._call(self._core.update_queue(queue, **kwargs))

    def delete_queue(self, queue_name: str, **kwargs: Any) -> None:
        """Delete the queue in both namespaces."""
        self._call(self._core.delete_queue(queue_name, **kwargs))

    def list_queues(self, **kwargs: Any) -> Paged[sdk.QueueProperties]:
        """Every queue of either namespace, each annotated with the regions that have it."""
        return self._call(_whole(self._core.list_queues(**kwargs)))

    def list_queues_runtime_properties(self, **kwargs: Any) -> Paged[sdk.QueueRuntimeProperties]:
        """Every queue's runtime properties, each annotated with both regions'."""
        return self._call(_whole(self._core.list_queues_runtime_properties(**kwargs)))

    def create_topic(self, topic_name: str, **kwargs: Any) -> sdk.TopicProperties:
        """Create the topic in both namespaces (the SDK's arguments)."""
        return self._call(self._core.create_topic(topic_name, **kwargs))

    def get_topic(self, topic_name: str, **kwargs: Any) -> sdk.TopicProperties:
        """The topic's properties (the primary's), annotated with both regions'."""
        return self._call(self._core.get_topic(topic_name, **kwargs))

    def get_topic_runtime_properties(
        self, topic_name: str, **kwargs: Any
    ) -> sdk.TopicRuntimeProperties:
        """The topic's runtime properties (the primary's), annotated with both regions'."""
        return self._call(self._core.get_topic_runtime_properties(topic_name, **kwargs))

    def update_topic(self, topic: sdk.TopicProperties | Mapping[str, Any], **kwargs: Any) -> None:
        """Apply the same settings to the topic in both namespaces."""
        self._call(self._core.update_topic(topic, **kwargs))

    def delete_topic(self, topic_name: str, **kwargs: Any) -> None:
        """Delete the topic in both namespaces."""
        self._call(self._core.delete_topic(topic_name, **kwargs))

    def list_topics(self, **kwargs: Any) -> Paged[sdk.TopicProperties]:
        """Every topic of either namespace, each annotated with the regions that have it."""
        return self._call(_whole(self._core.list_topics(**kwargs)))

    def list_topics_runtime_properties(self, **kwargs: Any) -> Paged[sdk.TopicRuntimeProperties]:
        """Every topic's runtime properties, each annotated with both regions'."""
        return self._call(_whole(self._core.list_topics_runtime_properties(**kwargs)))

    def create_subscription(
        self, topic_name: str, subscription_name: str, **kwargs: Any
    ) -> sdk.SubscriptionProperties:
        """Create the subscription in both namespaces (the SDK's arguments)."""
        return self._call(self._core.create_subscription(topic_name, subscription_name, **kwargs))

    def get_subscription(
        self, topic_name: str, subscription_name: str, **kwargs: Any
    ) -> sdk.SubscriptionProperties:
        """The subscription's properties (the primary's), annotated with both regions'."""
        return self._call(self._core.get_subscription(topic_name, subscription_name, **kwargs))

    def get_subscription_runtime_properties(
        self, topic_name: str, subscription_name: str, **kwargs: Any
    ) -> sdk.SubscriptionRuntimeProperties:
        """The subscription's runtime properties (the primary's), annotated with both regions'."""
        return self._call(
            self._core.get_subscription_runtime_properties(topic_name, subscription_name, **kwargs)
        )

    def update_subscription(
        self,
        topic_name: str,
        subscription: sdk.SubscriptionProperties | Mapping[str, Any],
        **kwargs: Any,
    ) -> None:
        """Apply the same settings to the subscription in both namespaces."""
        self._call(self._core.update_subscription(topic_name, subscription, **kwargs))

    def delete_subscription(self, topic_name: str, subscription_name: str, **kwargs: Any) -> None:
        """Delete the subscription in both namespaces."""
        self._call(self._core.delete_subscription(topic_name, subscription_name, **kwargs))

    def list_subscriptions(
        self, topic_name: str, **kwargs: Any
    ) -> Paged[sdk.SubscriptionProperties]:
        """Every subscription of either namespace, each annotated with the regions that have it."""
        return self._call(_whole(self._core.list_subscriptions(topic_name, **kwargs)))

    def list_subscriptions_runtime_properties(
        self, topic_name: str, **kwargs: Any
    ) -> Paged[sdk.SubscriptionRuntimeProperties]:
        """Every subscription's runtime properties, each annotated with both regions'."""
        return self._call(
            _whole(self._core.list_subscriptions_runtime_properties(topic_name, **kwargs))
        )

    def create_rule(
        self, topic_name: str, subscription_name: str, rule_name: str, **kwargs: Any
    ) -> sdk.RuleProperties:
        """Create the rule in both namespaces."""
        return self._call(
            self._core.create_rule(topic_name, subscription_name, rule_name, **kwargs)
        )

    def get_rule(
        self, topic_name: str, subscription_name: str, rule_name: str, **kwargs: Any
    ) -> sdk.RuleProperties:
        """The rule's properties (the primary's), annotated with both regions'."""
        return self._call(self._core.get_rule(topic_name, subscription_name, rule_name, **kwargs))

    def update_rule(
        self,
        topic_name: str,
        subscription_name: str,
        rule: sdk.RuleProperties | Mapping[str, Any],
        **kwargs: Any,
    ) -> None:
        """Apply the same rule to the subscription in both namespaces."""
        self._call(self._core.update_rule(topic_name, subscription_name, rule, **kwargs))

    def delete_rule(
        self, topic_name: str, subscription_name: str, rule_name: str, **kwargs: Any
    ) -> None:
        """Delete the rule in both namespaces."""
        self._call(self._core.delete_rule(topic_name, subscription_name, rule_name, **kwargs))

    def list_rules(
        self, topic_name: str, subscription_name: str, **kwargs: Any
    ) -> Paged[sdk.RuleProperties]:
        """Every rule of the subscription in either namespace, annotated."""
        return self._call(_whole(self._core.list_rules(topic_name, subscription_name, **kwargs)))

    def get_namespace_properties(self, **kwargs: Any) -> sdk.NamespaceProperties:
        """The primary namespace's properties, annotated with both."""
        return self._call(self._core.get_namespace_properties(**kwargs))
