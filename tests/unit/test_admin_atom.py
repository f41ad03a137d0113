"""The emulator's admin endpoint, driven by the real azure-servicebus administration clients.

The app runs over TLS on 127.0.0.1 in a background thread (its own event loop), so the
blocking sync client and the async client can both talk to it. Clients are built with
``from_connection_string``: in azure-servicebus 7.15 the admin client's constructor does not
accept ``AzureNamedKeyCredential`` (its pipeline calls ``get_token``, which that credential
lacks), so a connection string is how a key-based client is made.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import threading
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote_plus

import pytest
from aiohttp import web
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
)
from azure.servicebus.aio.management import (
    ServiceBusAdministrationClient as AsyncAdministrationClient,
)
from azure.servicebus.management import (
    QueueProperties,
    QueueRuntimeProperties,
    ServiceBusAdministrationClient,
    SqlRuleAction,
    SqlRuleFilter,
    SubscriptionProperties,
    SubscriptionRuntimeProperties,
    TopicProperties,
    TopicRuntimeProperties,
    TrueRuleFilter,
)
from azure.servicebus.management._generated import models as sdk_models

from georep.adapters.emulator import _atom
from georep.adapters.emulator._admin import (
    AdminAuthError,
    EntityExistsError,
    EntityKind,
    EntityNotFoundError,
    InvalidEntityError,
    build_admin_app,
)
from georep.adapters.emulator._atom import (
    TIMESPAN_MAX,
    AtomError,
    default_properties,
    format_duration,
    parse_description,
    parse_duration,
    parse_rule,
)
from georep.adapters.emulator._rules import InvalidRuleError, RuleSet
from georep.adapters.emulator._tls import make_self_signed_certificate, server_ssl_context

KEY_NAME = "RootManageSharedAccessKey"
KEY = "dGVzdC1rZXktbm90LWEtc2VjcmV0"
# How the SDK reads TimeSpan.MaxValue: the 7th fractional digit rounds up to 477581 µs.
SDK_TIMESPAN_MAX = TIMESPAN_MAX + timedelta(microseconds=1)
_COUNT_KEYS = (
    "total_message_count",
    "active_message_count",
    "dead_letter_message_count",
    "scheduled_message_count",
    "transfer_message_count",
    "transfer_dead_letter_message_count",
    "size_in_bytes",
)
_IMMUTABLE = ("requires_session", "enable_partitioning")


class MemoryBackend:
    """A dict-based AdminBackend that checks SAS tokens the way the service does."""

    def __init__(self) -> None:
        # (kind, lower-cased path) -> (path as created, properties); names are case-insensitive.
        self.entities: dict[tuple[EntityKind, str], tuple[str, dict[str, Any]]] = {}
        self.subscription_rules: dict[str, RuleSet] = {}
        self.list_calls = 0

    def authorize(self, authorization: str | None, url: str) -> None:
        if not authorization or not authorization.startswith("SharedAccessSignature "):
            raise AdminAuthError("MissingToken: The authorization header was not found.")
        token = {k: v[0] for k, v in parse_qs(authorization.split(" ", 1)[1]).items()}
        signed = f"{quote_plus(token.get('sr', ''))}\n{token.get('se', '')}".encode()
        expected = base64.b64encode(hmac.digest(KEY.encode(), signed, hashlib.sha256)).decode()
        if token.get("skn") != KEY_NAME or not hmac.compare_digest(expected, token.get("sig", "")):
            raise AdminAuthError("InvalidSignature: The token has an invalid signature.")
        if not url.lower().startswith(token["sr"].lower()) or int(token["se"]) < time.time():
            raise AdminAuthError("InvalidAudience: The token is expired or not for this URL.")

    def create_entity(
        self, kind: EntityKind, path: str, properties: dict[str, Any]
    ) -> dict[str, Any]:
        if (kind, path.lower()) in self.entities:
            raise EntityExistsError(f"The messaging entity '{path}' already exists.")
        now = datetime.now(UTC)
        record = default_properties(kind) | _validated(properties) | dict.fromkeys(_COUNT_KEYS, 0)
        record |= {"created_at_utc": now, "updated_at_utc": now, "accessed_at_utc": now}
        self.entities[kind, path.lower()] = (path, record)
        if kind is EntityKind.SUBSCRIPTION:
            self.subscription_rules[path.lower()] = RuleSet.with_default(self.now())
        return self._view(kind, path, record)

    def update_entity(
        self, kind: EntityKind, path: str, properties: dict[str, Any]
    ) -> dict[str, Any]:
        if (kind, path.lower()) not in self.entities:
            raise EntityNotFoundError(f"Entity '{path}' was not found.")
        path, record = self.entities[kind, path.lower()]
        # A PUT replaces all settable properties: what the client left out reverts to default.
        replacement = default_properties(kind) | _validated(properties)
        for key in _IMMUTABLE:
            if key in record and replacement.get(key) != record[key]:
                raise InvalidEntityError(f"The value of {key} cannot be changed.")
        record |= replacement | {"updated_at_utc": datetime.now(UTC)}
        return self._view(kind, path, record)

    def get_entity(self, kind: EntityKind, path: str) -> dict[str, Any] | None:
        found = self.entities.get((kind, path.lower()))
        return None if found is None else self._view(kind, *found)

    def list_entities(
        self, kind: EntityKind, parent: str | None
    ) -> list[tuple[str, dict[str, Any]]]:
        self.list_calls += 1
        prefix = f"{parent}/subscriptions/".lower() if parent else ""
        return [
            (path, self._view(k, path, record))
            for (k, key), (path, record) in self.entities.items()
            if k is kind and key.startswith(prefix)
        ]

    def delete_entity(self, kind: EntityKind, path: str) -> bool:
        if self.entities.pop((kind, path.lower()), None) is None:
            return False
        if kind is EntityKind.TOPIC:
            for _, sub_path in self._subscription_keys(path):
                del self.entities[EntityKind.SUBSCRIPTION, sub_path]
        return True

    def rules(self, subscription_path: str) -> RuleSet | None:
        if (EntityKind.SUBSCRIPTION, subscription_path.lower()) not in self.entities:
            return None
        return self.subscription_rules[subscription_path.lower()]

    def now(self) -> float:
        return time.time()

    def set_runtime(self, kind: EntityKind, path: str, **values: int) -> None:
        """Stand in for the broker: set message counts as if messages had flowed."""
        self.entities[kind, path.lower()][1].update(values)

    def _subscription_keys(self, topic: str) -> list[tuple[EntityKind, str]]:
        prefix = f"{topic}/subscriptions/".lower()
        return [
            key
            for key in self.entities
            if key[0] is EntityKind.SUBSCRIPTION and key[1].startswith(prefix)
        ]

    def _view(self, kind: EntityKind, path: str, record: dict[str, Any]) -> dict[str, Any]:
        view = dict(record)
        if kind is EntityKind.TOPIC:
            view["subscription_count"] = len(self._subscription_keys(path))
        return view


def _validated(properties: dict[str, Any]) -> dict[str, Any]:
    lock = properties.get("lock_duration")
    if lock is not None and not timedelta(seconds=5) <= lock <= timedelta(minutes=5):
        raise InvalidEntityError("LockDuration must be between 5 seconds and 5 minutes.")
    return properties


class ServerThread:
    """Serves the admin app over TLS from a thread with its own event loop."""

    def __init__(self, app: web.Application, cert: Path, key: Path) -> None:
        self._app = app
        self._ssl = server_ssl_context(cert, key)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="admin-app", daemon=True)
        self.port = 0

    def __enter__(self) -> ServerThread:
        self._thread.start()
        assert self._ready.wait(timeout=30), "admin app did not start"
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        runner = web.AppRunner(self._app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=self._ssl)
        self._loop.run_until_complete(site.start())
        self.port = runner.addresses[0][1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())
        self._loop.close()


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_self_signed_certificate(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def backend() -> MemoryBackend:
    return MemoryBackend()


@pytest.fixture
def server(backend: MemoryBackend, tls_files: tuple[Path, Path]) -> Iterator[ServerThread]:
    with ServerThread(build_admin_app(backend), *tls_files) as running:
        yield running


def _connection_string(port: int, key: str = KEY) -> str:
    return (
        f"Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName={KEY_NAME};"
        f"SharedAccessKey={key};UseDevelopmentEmulator=true"
    )


def _sync_client(
    server: ServerThread, cert: Path, key: str = KEY
) -> ServiceBusAdministrationClient:
    # retry_total=0: a server error must fail the test at once, not after backoff sleeps.
    return ServiceBusAdministrationClient.from_connection_string(
        _connection_string(server.port, key), connection_verify=str(cert), retry_total=0
    )


@pytest.fixture
def admin(
    server: ServerThread, tls_files: tuple[Path, Path]
) -> Iterator[ServiceBusAdministrationClient]:
    with _sync_client(server, tls_files[0]) as client:
        yield client


@pytest.fixture
async def async_admin(
    server: ServerThread, tls_files: tuple[Path, Path]
) -> AsyncIterator[AsyncAdministrationClient]:
    client = AsyncAdministrationClient.from_connection_string(
        _connection_string(server.port), connection_verify=str(tls_files[0]), retry_total=0
    )
    async with client:
        yield client


def test_durations_round_trip_including_timespan_max() -> None:
    for text, value in [
        ("PT1M", timedelta(minutes=1)),
        ("P1DT2H3M4.5S", timedelta(days=1, hours=2, minutes=3, seconds=4.5)),
        ("PT0S", timedelta(0)),
        ("P10675199DT2H48M5.4775807S", TIMESPAN_MAX),
    ]:
        assert parse_duration(text) == value
        assert format_duration(value) == text
    # The SDK's own spellings of "infinite" and anything beyond it all mean TIMESPAN_MAX.
    assert parse_duration("P10675199DT2H48M5.477581S") == TIMESPAN_MAX
    assert parse_duration("P10675199DT2H48M5.477539S") == TIMESPAN_MAX  # after SDK float math
    assert parse_duration("P99999999D") == TIMESPAN_MAX
    assert format_duration(SDK_TIMESPAN_MAX) == "P10675199DT2H48M5.4775807S"
    for bad in ("P", "PT", "1D", "P1Y", "P1W", "PT1.S", "PT1Mx"):
        with pytest.raises(ValueError, match="ISO-8601"):
            parse_duration(bad)


def test_parse_description_rejects_bodies_it_cannot_trust() -> None:
    with pytest.raises(AtomError, match="not well-formed"):
        parse_description(b"<entry")
    with pytest.raises(AtomError, match="Document type"):
        parse_description(b'<!DOCTYPE x [<!ENTITY a "b">]><entry/>')
    bad_value = (
        b'<entry xmlns="http://www.w3.org/2005/Atom"><content type="application/xml">'
        b'<QueueDescription xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/'
        b'connect"><MaxDeliveryCount>many</MaxDeliveryCount></QueueDescription></content></entry>'
    )
    with pytest.raises(AtomError, match="MaxDeliveryCount"):
        parse_description(bad_value)


def _rule_body(inner: str) -> bytes:
    return (
        '<entry xmlns="http://www.w3.org/2005/Atom"><content type="application/xml">'
        '<RuleDescription xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/'
        'connect" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">'
        f"{inner}</RuleDescription></content></entry>"
    ).encode()


def test_parse_rule_reads_typed_parameters_and_refuses_what_it_cannot_model() -> None:
    rule_filter, action = parse_rule(
        _rule_body(
            '<Filter xsi:type="SqlFilter"><SqlExpression>n &gt; @n AND t &lt; @t</SqlExpression>'
            "<Parameters><KeyValueOfstringanyType><Key>@n</Key>"
            '<Value xmlns:d6p1="http://www.w3.org/2001/XMLSchema" xsi:type="d6p1:long">5</Value>'
            "</KeyValueOfstringanyType><KeyValueOfstringanyType><Key>@t</Key>"
            '<Value xmlns:d6p1="http://www.w3.org/2001/XMLSchema" xsi:type="d6p1:duration">PT1M'
            "</Value></KeyValueOfstringanyType></Parameters></Filter>"
        )
    )
    assert (rule_filter.kind, action.kind) == ("SqlFilter", "EmptyRuleAction")
    assert rule_filter.parameters == {"@n": 5, "@t": timedelta(minutes=1)}
    assert parse_rule(_rule_body(""))[0].kind == "TrueFilter"  # no Filter: accept everything
    with pytest.raises(AtomError, match="unsupported type 'base64Binary'"):
        parse_rule(
            _rule_body(
                '<Filter xsi:type="CorrelationFilter"><Properties><KeyValueOfstringanyType>'
                '<Key>k</Key><Value xsi:type="d6p1:base64Binary">AA==</Value>'
                "</KeyValueOfstringanyType></Properties></Filter>"
            )
        )
    with pytest.raises(AtomError, match="Unsupported filter type 'XPathFilter'"):
        parse_rule(_rule_body('<Filter xsi:type="XPathFilter"/>'))
    with pytest.raises(InvalidRuleError, match="could not be parsed"):
        parse_rule(
            _rule_body('<Filter xsi:type="SqlFilter"><SqlExpression>a =</SqlExpression></Filter>')
        )
    with pytest.raises(AtomError, match="Expected a RuleDescription"):
        parse_rule(_rule_body("").replace(b"RuleDescription", b"QueueDescription"))


@pytest.mark.parametrize(
    ("kind", "model", "public", "runtime"),
    [
        ("queue", sdk_models.QueueDescription, QueueProperties, QueueRuntimeProperties),
        ("topic", sdk_models.TopicDescription, TopicProperties, TopicRuntimeProperties),
        (
            "subscription",
            sdk_models.SubscriptionDescription,
            SubscriptionProperties,
            SubscriptionRuntimeProperties,
        ),
    ],
)
def test_field_tables_match_the_sdk_models(
    kind: str, model: Any, public: Any, runtime: type[object]
) -> None:
    # Guards the fields no end-to-end test happens to exercise against typos and SDK drift.
    sdk_tags = {spec["xml"]["name"] for spec in model._attribute_map.values() if "xml" in spec}
    _, fields = _atom._DESCRIPTIONS[kind]
    assert {field.tag for field in fields} <= sdk_tags | {"CountDetails"}
    public_keys = set(public._from_internal_entity("x", model()).keys())
    runtime_keys = {name for name in dir(runtime) if not name.startswith("_")}
    assert {f.key for f in fields if f.writable} <= public_keys
    assert {f.key for f in fields if not f.writable} - {""} <= runtime_keys | public_keys
    assert set(default_properties(kind)) <= public_keys


def test_queue_round_trips_non_default_properties(
    admin: ServiceBusAdministrationClient, backend: MemoryBackend
) -> None:
    created = admin.create_queue(
        "orders",
        lock_duration=timedelta(seconds=45),
        max_delivery_count=3,
        requires_duplicate_detection=True,
        duplicate_detection_history_time_window=timedelta(minutes=2),
        default_message_time_to_live=timedelta(hours=1),
        dead_lettering_on_message_expiration=True,
        enable_partitioning=True,
        user_metadata="team=payments",
    )
    fetched = admin.get_queue("ORDERS")  # names are case-insensitive
    for queue in (created, fetched):
        assert queue.lock_duration == timedelta(seconds=45)
        assert queue.max_delivery_count == 3
        assert queue.requires_duplicate_detection is True
        assert queue.duplicate_detection_history_time_window == timedelta(minutes=2)
        assert queue.default_message_time_to_live == timedelta(hours=1)
        assert queue.dead_lettering_on_message_expiration is True
        assert queue.enable_partitioning is True
        assert queue.user_metadata == "team=payments"
        assert queue.requires_session is False
        assert queue.auto_delete_on_idle == SDK_TIMESPAN_MAX
        assert queue.status == "Active"
    stored = backend.get_entity(EntityKind.QUEUE, "orders")
    assert stored is not None and stored["max_delivery_count"] == 3

    # Update sends the whole description back (runtime fields included) with If-Match: *.
    fetched.max_delivery_count = 7
    fetched.lock_duration = timedelta(minutes=2)
    fetched.user_metadata = None
    admin.update_queue(fetched)
    updated = admin.get_queue("orders")
    assert (updated.max_delivery_count, updated.lock_duration) == (7, timedelta(minutes=2))
    assert updated.user_metadata is None
    assert updated.requires_duplicate_detection is True
    assert updated.auto_delete_on_idle == SDK_TIMESPAN_MAX

    assert [q.name for q in admin.list_queues()] == ["orders"]
    admin.delete_queue("orders")
    with pytest.raises(ResourceNotFoundError):
        admin.get_queue("orders")
    with pytest.raises(ResourceNotFoundError):
        admin.delete_queue("orders")
    assert list(admin.list_queues()) == []


def test_queue_runtime_properties_come_from_the_backend(
    admin: ServiceBusAdministrationClient, backend: MemoryBackend
) -> None:
    admin.create_queue("q")
    backend.set_runtime(
        EntityKind.QUEUE,
        "q",
        total_message_count=9,
        active_message_count=5,
        dead_letter_message_count=2,
        scheduled_message_count=1,
        transfer_message_count=0,
        transfer_dead_letter_message_count=1,
        size_in_bytes=4096,
    )
    runtime = admin.get_queue_runtime_properties("q")
    assert runtime.name == "q"
    assert runtime.total_message_count == 9
    assert runtime.active_message_count == 5
    assert runtime.dead_letter_message_count == 2
    assert runtime.scheduled_message_count == 1
    assert runtime.transfer_dead_letter_message_count == 1
    assert runtime.size_in_bytes == 4096
    assert runtime.created_at_utc is not None and runtime.created_at_utc.tzinfo is not None
    [listed] = admin.list_queues_runtime_properties()
    assert listed.active_message_count == 5


def test_create_conflicts_and_missing_entities_map_to_sdk_errors(
    admin: ServiceBusAdministrationClient,
) -> None:
    admin.create_queue("taken")
    with pytest.raises(ResourceExistsError):
        admin.create_queue("taken")
    with pytest.raises(ResourceExistsError):
        admin.create_topic("taken")  # queues and topics share one name space
    missing = admin.get_queue("taken")
    admin.delete_queue("taken")
    with pytest.raises(ResourceNotFoundError):
        admin.update_queue(missing)
    with pytest.raises(ResourceNotFoundError):
        admin.get_queue_runtime_properties("taken")
    with pytest.raises(ResourceNotFoundError):
        admin.create_subscription("no-such-topic", "s")


def test_invalid_values_surface_the_backend_message(
    admin: ServiceBusAdministrationClient,
) -> None:
    with pytest.raises(HttpResponseError, match="LockDuration must be between") as raised:
        admin.create_queue("q", lock_duration=timedelta(minutes=10))
    assert raised.value.status_code == 400
    queue = admin.create_queue("q")
    queue.requires_session = True
    with pytest.raises(HttpResponseError, match="requires_session cannot be changed"):
        admin.update_queue(queue)


def test_queue_names_with_slashes(admin: ServiceBusAdministrationClient) -> None:
    admin.create_queue("app/orders", max_delivery_count=4)
    assert admin.get_queue("app/orders").max_delivery_count == 4
    assert [q.name for q in admin.list_queues()] == ["app/orders"]
    admin.delete_queue("app/orders")


def test_list_queues_pages_with_skip_and_top(
    admin: ServiceBusAdministrationClient, backend: MemoryBackend
) -> None:
    names = [f"queue-{i:03d}" for i in range(250)]
    for name in reversed(names):
        backend.create_entity(EntityKind.QUEUE, name, {})
    assert [q.name for q in admin.list_queues()] == names
    assert backend.list_calls == 3  # pages of 100, 100 and 50
    assert [q.name for q in admin.list_queues(max_page_size=40)][-1] == "queue-249"


def test_wrong_key_raises_client_authentication_error(
    server: ServerThread, tls_files: tuple[Path, Path], backend: MemoryBackend
) -> None:
    wrong_key = "d3Jvbmcta2V5LW5vdC1hLXNlY3JldA=="
    with _sync_client(server, tls_files[0], key=wrong_key) as client:
        with pytest.raises(ClientAuthenticationError, match="InvalidSignature") as raised:
            client.create_queue("q")
        with pytest.raises(ClientAuthenticationError):
            list(client.list_queues())
    assert raised.value.status_code == 401
    assert wrong_key not in str(raised.value) and KEY not in str(raised.value)
    assert backend.entities == {}


def test_namespace_properties(admin: ServiceBusAdministrationClient) -> None:
    namespace = admin.get_namespace_properties()
    assert namespace.name == "georep-emulator"
    assert namespace.messaging_sku == "Standard"
    assert namespace.created_at_utc is not None


async def test_topics_and_subscriptions_with_the_async_client(
    async_admin: AsyncAdministrationClient, backend: MemoryBackend
) -> None:
    topic = await async_admin.create_topic(
        "events",
        default_message_time_to_live=timedelta(days=1),
        requires_duplicate_detection=True,
        duplicate_detection_history_time_window=timedelta(minutes=3),
        max_size_in_megabytes=2048,
    )
    assert topic.default_message_time_to_live == timedelta(days=1)
    assert topic.duplicate_detection_history_time_window == timedelta(minutes=3)
    assert topic.max_size_in_megabytes == 2048
    with pytest.raises(ResourceExistsError):
        await async_admin.create_topic("events")

    sub = await async_admin.create_subscription(
        "events",
        "audit",
        lock_duration=timedelta(seconds=30),
        max_delivery_count=2,
        dead_lettering_on_message_expiration=True,
        requires_session=False,
    )
    await async_admin.create_subscription("events", "billing")
    assert (sub.name, sub.lock_duration, sub.max_delivery_count) == (
        "audit",
        timedelta(seconds=30),
        2,
    )
    assert sub.dead_lettering_on_filter_evaluation_exceptions is True  # service default
    with pytest.raises(ResourceExistsError):
        await async_admin.create_subscription("events", "audit")

    fetched = await async_admin.get_subscription("events", "audit")
    fetched.max_delivery_count = 6
    await async_admin.update_subscription("events", fetched)
    assert (await async_admin.get_subscription("events", "audit")).max_delivery_count == 6
    names = [s.name async for s in async_admin.list_subscriptions("events")]
    assert names == ["audit", "billing"]

    backend.set_runtime(
        EntityKind.SUBSCRIPTION, "events/subscriptions/audit", active_message_count=4
    )
    backend.set_runtime(EntityKind.TOPIC, "events", scheduled_message_count=3, size_in_bytes=10)
    sub_runtime = await async_admin.get_subscription_runtime_properties("events", "audit")
    assert sub_runtime.active_message_count == 4
    topic_runtime = await async_admin.get_topic_runtime_properties("events")
    assert topic_runtime.subscription_count == 2
    assert (topic_runtime.scheduled_message_count, topic_runtime.size_in_bytes) == (3, 10)
    assert [t.name async for t in async_admin.list_topics()] == ["events"]

    rules = [r async for r in async_admin.list_rules("events", "audit")]
    assert [(r.name, type(r.filter)) for r in rules] == [("$Default", TrueRuleFilter)]
    assert (await async_admin.get_rule("events", "audit", "$Default")).name == "$Default"
    with pytest.raises(ResourceNotFoundError):
        await async_admin.get_rule("events", "audit", "other")
    created = await async_admin.create_rule(
        "events",
        "audit",
        "eu",
        filter=SqlRuleFilter("region = @region", parameters={"@region": "eu"}),
        action=SqlRuleAction("SET seen = 1"),
    )
    assert (created.name, created.filter.parameters) == ("eu", {"@region": "eu"})
    with pytest.raises(HttpResponseError, match="could not be parsed") as refused:
        await async_admin.create_rule("events", "audit", "bad", filter=SqlRuleFilter("a ="))
    assert refused.value.status_code == 400
    await async_admin.delete_rule("events", "audit", "$Default")
    assert [r.name async for r in async_admin.list_rules("events", "audit")] == ["eu"]

    await async_admin.delete_subscription("events", "billing")
    with pytest.raises(ResourceNotFoundError):
        await async_admin.get_subscription("events", "billing")
    await async_admin.delete_topic("events")
    with pytest.raises(ResourceNotFoundError):
        await async_admin.get_topic("events")
    assert backend.entities == {}  # subscriptions went with their topic


async def test_async_client_maps_auth_and_missing_errors(
    server: ServerThread, tls_files: tuple[Path, Path]
) -> None:
    client = AsyncAdministrationClient.from_connection_string(
        _connection_string(server.port, key="bm90LXRoZS1rZXk="),
        connection_verify=str(tls_files[0]),
        retry_total=0,
    )
    async with client:
        with pytest.raises(ClientAuthenticationError):
            await client.get_queue("q")
    async with AsyncAdministrationClient.from_connection_string(
        _connection_string(server.port), connection_verify=str(tls_files[0]), retry_total=0
    ) as good:
        with pytest.raises(ResourceNotFoundError):
            await good.get_queue_runtime_properties("q")
        with pytest.raises(ResourceNotFoundError):
            await good.delete_queue("q")
