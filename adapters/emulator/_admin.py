"""The emulator's management endpoint: the Atom-over-HTTPS API of the admin client.

:func:`build_admin_app` serves the routes the SDK calls (api-versions 2017-04, 2021-05 and
2024-05 look the same on the wire) and delegates state to an :class:`AdminBackend`. Status codes
follow the real service, because the SDK's error mapping depends on them:

* GET of a missing entity is ``200`` with an empty feed; the SDK finds no ``content`` in it and
  raises ``ResourceNotFoundError`` itself.
* PUT without ``If-Match`` creates: ``201``, or ``409`` if the name is taken
  (``ResourceExistsError``). PUT with ``If-Match: *`` (what ``update_*`` sends) replaces: ``200``,
  or ``404`` if missing (``ResourceNotFoundError``).
* DELETE answers ``200`` with an empty body, or ``404``.
* ``401`` becomes ``ClientAuthenticationError``; ``400`` becomes ``HttpResponseError`` whose
  message is the ``Detail`` of the error body.

Rules (``{topic}/Subscriptions/{sub}/Rules/{rule}``) follow the same pattern: create ``201`` or
``409``, update ``200`` or ``404``, delete ``200`` or ``404``, a missing rule is an empty feed, and
a filter or action that does not parse is ``400``.
"""

from __future__ import annotations

__all__ = [
    "AdminAuthError",
    "AdminBackend",
    "AdminError",
    "EntityExistsError",
    "EntityKind",
    "EntityNotFoundError",
    "InvalidEntityError",
    "QuotaExceededError",
    "build_admin_app",
]

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final, Protocol
from urllib.parse import unquote

from aiohttp import web

from ._atom import (
    AtomContext,
    AtomError,
    parse_description,
    parse_rule,
    render_empty_feed,
    render_entity_feed,
    render_entry,
    render_error,
    render_namespace_entry,
    render_rule_entry,
    render_rule_feed,
)
from ._rules import Rule, RuleError, RuleSet

_log = logging.getLogger(__name__)

_ENTRY_TYPE: Final = "application/atom+xml;type=entry;charset=utf-8"
_FEED_TYPE: Final = "application/atom+xml;type=feed;charset=utf-8"
_ERROR_TYPE: Final = "application/xml; charset=utf-8"
_DEFAULT_API_VERSION: Final = "2021-05"
_DEFAULT_PAGE_SIZE: Final = 100

_Item = tuple[str, dict[str, Any]]


class EntityKind(StrEnum):
    """The kinds of entity the management API creates."""

    QUEUE = "queue"
    TOPIC = "topic"
    SUBSCRIPTION = "subscription"


class AdminError(Exception):
    """Raised by an :class:`AdminBackend`; the message becomes the error body's ``Detail``.

    Messages are sent to the client, so they must never contain keys or tokens.

    Attributes:
        status: HTTP status code answered for this error.
    """

    status: int = 500


class AdminAuthError(AdminError):
    """The request's credentials are missing, invalid, expired or lack a right (``401``)."""

    status = 401


class EntityExistsError(AdminError):
    """Create of an entity whose name is already taken (``409``)."""

    status = 409


class EntityNotFoundError(AdminError):
    """Update of a missing entity, or create under a missing topic (``404``)."""

    status = 404


class InvalidEntityError(AdminError, ValueError):
    """A property value is out of range or a property may not change (``400``)."""

    status = 400


class QuotaExceededError(AdminError):
    """A namespace quota is reached, e.g. 100 partitioned entities (``403``).

    The SDK raises a plain ``azure.core.exceptions.HttpResponseError`` with this message.
    """

    status = 403


class AdminBackend(Protocol):
    """Entity state behind the management endpoint.

    Paths are what the SDK addresses: a queue or topic name (which may contain ``/``), and
    ``"{topic}/subscriptions/{subscription}"`` for a subscription, the same string the AMQP side
    uses as the subscription's address. Property dicts use the keys of
    :mod:`adapters.emulator._atom` (SDK snake_case names, timedeltas, aware UTC datetimes).

    Methods are synchronous and called on the event loop, so they must not block.
    """

    def authorize(self, authorization: str | None, url: str) -> None:
        """Check the ``Authorization`` header (a SAS token) for a request to ``url``.

        Raises:
            AdminAuthError: The request must be rejected.
        """

    def create_entity(
        self, kind: EntityKind, path: str, properties: dict[str, Any]
    ) -> dict[str, Any]:
        """Create an entity from the settable properties the client sent.

        Absent keys take the service defaults (``_atom.default_properties``). The admin app has
        already checked that a queue and a topic do not share ``path`` and that a subscription's
        topic exists.

        Returns:
            All properties of the new entity, including the runtime ones.

        Raises:
            EntityExistsError: ``path`` is taken.
            InvalidEntityError: A value is not acceptable.
        """

    def update_entity(
        self, kind: EntityKind, path: str, properties: dict[str, Any]
    ) -> dict[str, Any]:
        """Replace the settable properties of an entity.

        The SDK sends every property that is not ``None`` on the client, so an absent key means
        "unset" and reverts to its default, as with the real service.

        Returns:
            All properties after the update, including the runtime ones.

        Raises:
            EntityNotFoundError: No such entity.
            InvalidEntityError: A value is not acceptable, or an immutable property such as
                ``requires_session`` would change.
        """

    def get_entity(self, kind: EntityKind, path: str) -> dict[str, Any] | None:
        """Return all properties of an entity, including the runtime ones, or ``None``."""

    def list_entities(
        self, kind: EntityKind, parent: str | None
    ) -> list[tuple[str, dict[str, Any]]]:
        """Return ``(path, properties)`` of every entity of ``kind``, in any order.

        ``parent`` is the topic name for subscriptions and ``None`` otherwise.
        """

    def delete_entity(self, kind: EntityKind, path: str) -> bool:
        """Delete an entity (a topic together with its subscriptions); False if it was missing."""

    def rules(self, subscription_path: str) -> RuleSet | None:
        """The rules of a subscription, or ``None`` if there is no such subscription.

        The admin app creates, updates, lists and deletes rules through the returned
        :class:`~georep.adapters.emulator._rules.RuleSet`, which raises the
        :class:`~georep.adapters.emulator._rules.RuleError` the service would answer.
        """

    def now(self) -> float:
        """The backend's clock (seconds since the epoch), for the creation time of rules."""


class _Route:
    """What a request path addresses, decoded segment by segment.

    Segments are split on the raw path before unquoting, so a name the SDK sent as ``a%2Fb``
    stays one name while ``/`` separates the fixed parts of the URL.

    Attributes:
        target: ``namespace``, ``queues``, ``topics``, ``entity`` (queue or topic),
            ``subscriptions``, ``subscription``, ``rules``, ``rule`` or ``invalid``.
        topic: Queue or topic name (``entity``) or the topic owning a subscription.
    """

    def __init__(self, raw_path: str) -> None:
        segments = [unquote(part) for part in raw_path.strip("/").split("/")]
        lowered = [part.lower() for part in segments]
        self.topic = self.subscription = self.rule = ""
        if "" in segments:
            self.target = "invalid"
        elif lowered == ["$namespaceinfo"]:
            self.target = "namespace"
        elif lowered in (["$resources", "queues"], ["$resources", "topics"]):
            self.target = lowered[1]
        elif len(segments) >= 5 and lowered[-4] == "subscriptions" and lowered[-2] == "rules":
            self.target, self.rule = "rule", segments[-1]
            self._subscription(segments[:-2])
        elif len(segments) >= 4 and lowered[-3] == "subscriptions" and lowered[-1] == "rules":
            self.target = "rules"
            self._subscription(segments[:-1])
        elif len(segments) >= 3 and lowered[-2] == "subscriptions":
            self.target = "subscription"
            self._subscription(segments)
        elif len(segments) >= 2 and lowered[-1] == "subscriptions":
            self.target, self.topic = "subscriptions", "/".join(segments[:-1])
        elif lowered[0] == "$resources":
            self.target = "invalid"
        else:
            self.target, self.topic = "entity", "/".join(segments)

    def _subscription(self, segments: list[str]) -> None:
        self.topic, self.subscription = "/".join(segments[:-2]), segments[-1]

    @property
    def subscription_path(self) -> str:
        """The backend path of the addressed subscription."""
        return f"{self.topic}/subscriptions/{self.subscription}"


def build_admin_app(
    backend: AdminBackend, *, namespace: str = "georep-emulator"
) -> web.Application:
    """Build the aiohttp application serving the management API over ``backend``.

    Serve it over TLS: the SDK always uses ``https://``. Nothing here logs headers or bodies,
    so SAS tokens and keys never reach the logs.

    Args:
        backend: Entity state and authorization.
        namespace: Name reported by ``get_namespace_properties`` and as entry author.

    Returns:
        The application; add it to an ``AppRunner`` and a ``TCPSite`` with an SSL context.
    """
    created_at = datetime.now(UTC)

    async def handle(request: web.Request) -> web.Response:
        route = _Route(request.rel_url.raw_path)
        try:
            backend.authorize(request.headers.get("Authorization"), str(request.url))
            body = await request.read()
            context = AtomContext(
                base_url=f"{request.scheme}://{request.host}",
                api_version=request.query.get("api-version", _DEFAULT_API_VERSION),
                namespace=namespace,
            )
            if route.target == "invalid":
                raise InvalidEntityError("The entity path is empty or malformed.")
            handler = _HANDLERS.get((request.method, route.target))
            if handler is None:
                return _error(405, f"{request.method} is not supported on this resource.")
            return handler(_Call(backend, request, route, context, body, created_at))
        except AdminError as exc:
            return _error(exc.status, str(exc) or type(exc).__name__)
        except (AtomError, RuleError) as exc:
            return _error(getattr(exc, "status", 400), str(exc))
        except Exception:
            # No exception text in the response: it may quote backend internals.
            _log.exception("admin %s %s failed", request.method, route.target)
            return _error(500, "The emulator failed to process the request.")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


@dataclass(frozen=True)
class _Call:
    """Everything a route handler needs for one request."""

    backend: AdminBackend
    request: web.Request
    route: _Route
    context: AtomContext
    body: bytes
    created_at: datetime

    def page(self, items: list[_Item], path: str) -> tuple[list[_Item], str, str | None]:
        """Cut one ``$skip``/``$top`` page from ``items``; return it with self and next URLs."""
        try:
            skip = int(self.request.query.get("$skip", "0"))
            top = int(self.request.query.get("$top", str(_DEFAULT_PAGE_SIZE)))
        except ValueError:
            raise InvalidEntityError("$skip and $top must be integers.") from None
        if skip < 0 or top < 1:
            raise InvalidEntityError("$skip must be >= 0 and $top must be >= 1.")
        # Sorted so that consecutive pages neither repeat nor skip entities.
        ordered = sorted(items, key=lambda item: item[0].lower())
        more = skip + top < len(ordered)
        next_url = self.context.url(path, f"$skip={skip + top}&$top={top}") if more else None
        self_url = self.context.url(path, f"$skip={skip}&$top={top}")
        return ordered[skip : skip + top], self_url, next_url


def _response(status: int, body: bytes, content_type: str) -> web.Response:
    return web.Response(status=status, body=body, headers={"Content-Type": content_type})


def _error(status: int, detail: str) -> web.Response:
    # The service appends a tracking id; it helps correlate client errors with emulator logs.
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    detail = f"{detail} TrackingId:{uuid.uuid4()}, Timestamp:{stamp}"
    return _response(status, render_error(status, detail), _ERROR_TYPE)


def _entry(
    call: _Call, kind: EntityKind, path: str, props: dict[str, Any], status: int = 200
) -> web.Response:
    return _response(status, render_entry(call.context, kind, path, props), _ENTRY_TYPE)


def _not_found_feed() -> web.Response:
    return _response(200, render_empty_feed(), _FEED_TYPE)


def _put(call: _Call, kinds: tuple[EntityKind, ...], path: str) -> web.Response:
    parsed_kind, properties = parse_description(call.body)
    if parsed_kind not in kinds:
        raise InvalidEntityError(f"A {parsed_kind} description cannot be PUT at '{path}'.")
    kind = EntityKind(parsed_kind)
    if "If-Match" in call.request.headers:
        return _entry(call, kind, path, call.backend.update_entity(kind, path, properties))
    if kind is EntityKind.SUBSCRIPTION:
        if call.backend.get_entity(EntityKind.TOPIC, call.route.topic) is None:
            raise EntityNotFoundError(f"Entity '{call.route.topic}' was not found.")
    else:
        # Queues and topics share one name space.
        other = EntityKind.TOPIC if kind is EntityKind.QUEUE else EntityKind.QUEUE
        if call.backend.get_entity(other, path) is not None:
            raise EntityExistsError(f"The messaging entity '{path}' already exists.")
    created = call.backend.create_entity(kind, path, properties)
    return _entry(call, kind, path, created, status=201)


def _put_entity(call: _Call) -> web.Response:
    return _put(call, (EntityKind.QUEUE, EntityKind.TOPIC), call.route.topic)


def _put_subscription(call: _Call) -> web.Response:
    return _put(call, (EntityKind.SUBSCRIPTION,), call.route.subscription_path)


def _get_entity(call: _Call) -> web.Response:
    path = call.route.topic
    for kind in (EntityKind.QUEUE, EntityKind.TOPIC):
        if (props := call.backend.get_entity(kind, path)) is not None:
            return _entry(call, kind, path, props)
    return _not_found_feed()


def _get_subscription(call: _Call) -> web.Response:
    path = call.route.subscription_path
    props = call.backend.get_entity(EntityKind.SUBSCRIPTION, path)
    return (
        _not_found_feed() if props is None else _entry(call, EntityKind.SUBSCRIPTION, path, props)
    )


def _delete(call: _Call, kinds: tuple[EntityKind, ...], path: str) -> web.Response:
    if not any(call.backend.delete_entity(kind, path) for kind in kinds):
        raise EntityNotFoundError(f"Entity '{path}' was not found.")
    return web.Response(status=200)


def _delete_entity(call: _Call) -> web.Response:
    return _delete(call, (EntityKind.QUEUE, EntityKind.TOPIC), call.route.topic)


def _delete_subscription(call: _Call) -> web.Response:
    return _delete(call, (EntityKind.SUBSCRIPTION,), call.route.subscription_path)


def _list(call: _Call, kind: EntityKind, parent: str | None, path: str) -> web.Response:
    items, self_url, next_url = call.page(call.backend.list_entities(kind, parent), path)
    body = render_entity_feed(call.context, kind, items, self_url=self_url, next_url=next_url)
    return _response(200, body, _FEED_TYPE)


def _list_queues(call: _Call) -> web.Response:
    return _list(call, EntityKind.QUEUE, None, "$Resources/queues")


def _list_topics(call: _Call) -> web.Response:
    return _list(call, EntityKind.TOPIC, None, "$Resources/topics")


def _list_subscriptions(call: _Call) -> web.Response:
    topic = call.route.topic
    return _list(call, EntityKind.SUBSCRIPTION, topic, f"{topic}/subscriptions")


def _rules(call: _Call) -> RuleSet:
    rules = call.backend.rules(call.route.subscription_path)
    if rules is None:
        raise EntityNotFoundError(f"Entity '{call.route.subscription_path}' was not found.")
    return rules


def _rule_entry(call: _Call, rule: Rule, status: int = 200) -> web.Response:
    body = render_rule_entry(call.context, call.route.subscription_path, rule)
    return _response(status, body, _ENTRY_TYPE)


def _list_rules(call: _Call) -> web.Response:
    rules = call.backend.rules(call.route.subscription_path)
    if rules is None:
        return _not_found_feed()
    items: list[_Item] = [(rule.name, {"rule": rule}) for rule in rules]
    page, self_url, next_url = call.page(items, f"{call.route.subscription_path}/rules")
    body = render_rule_feed(
        call.context,
        call.route.subscription_path,
        [props["rule"] for _, props in page],
        self_url=self_url,
        next_url=next_url,
    )
    return _response(200, body, _FEED_TYPE)


def _get_rule(call: _Call) -> web.Response:
    rules = call.backend.rules(call.route.subscription_path)
    rule = None if rules is None else rules.get(call.route.rule)
    return _not_found_feed() if rule is None else _rule_entry(call, rule)


def _put_rule(call: _Call) -> web.Response:
    rules = _rules(call)
    rule_filter, action = parse_rule(call.body)
    rule = Rule(call.route.rule, rule_filter, action, created_at=call.backend.now())
    if "If-Match" in call.request.headers:
        return _rule_entry(call, rules.replace(rule))
    rules.add(rule)
    return _rule_entry(call, rule, status=201)


def _delete_rule(call: _Call) -> web.Response:
    _rules(call).remove(call.route.rule)
    return web.Response(status=200)


def _get_namespace(call: _Call) -> web.Response:
    body = render_namespace_entry(call.context, created_at=call.created_at)
    return _response(200, body, _ENTRY_TYPE)


_HANDLERS: Final[dict[tuple[str, str], Callable[[_Call], web.Response]]] = {
    ("GET", "namespace"): _get_namespace,
    ("GET", "queues"): _list_queues,
    ("GET", "topics"): _list_topics,
    ("GET", "subscriptions"): _list_subscriptions,
    ("GET", "rules"): _list_rules,
    ("GET", "entity"): _get_entity,
    ("PUT", "entity"): _put_entity,
    ("DELETE", "entity"): _delete_entity,
    ("GET", "subscription"): _get_subscription,
    ("PUT", "subscription"): _put_subscription,
    ("DELETE", "subscription"): _delete_subscription,
    ("GET", "rule"): _get_rule,
    ("PUT", "rule"): _put_rule,
    ("DELETE", "rule"): _delete_rule,
}
