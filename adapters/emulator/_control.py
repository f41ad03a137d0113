"""The emulator's HTTP control endpoint (loopback only): faults, entities, inspection.

Every request must carry ``Authorization: Bearer <control token>`` (generated at start,
printed by ``georep emulator``, ``Emulator.control_token``) and a ``Host`` of
``127.0.0.1:<port>`` or ``localhost:<port>``; a POST must be ``application/json``. So a
web page open on the developer's machine can neither read the keys (DNS rebinding: its
Host is its own name) nor inject faults (a cross-site POST cannot add the header, and a
form cannot send JSON). Refusals: wrong Host 403, no or wrong token 401, other body 415.

Routes (JSON in, JSON out):

- ``GET  /``                                   every namespace, its port and connection string
- ``GET  /namespaces/{ns}/entities``           runtime counts per queue/subscription
- ``POST /namespaces/{ns}/queues``             ``{"name": ..., "properties": {...}}``
- ``POST /namespaces/{ns}/topics``             a topic and its subscriptions:
  ``{"name": ..., "subscriptions": [...], "properties": {...}}``
- ``POST /namespaces/{ns}/faults/{fault}``     one row of :data:`FAULTS`: ``outage``,
  ``restore``, ``blackhole``,
  ``latency`` (``{"seconds": 0.2}``), ``reject-sends`` (``{"condition": "server-busy"}``),
  ``drop-dispositions`` (``{"count": 3}``: sends stored, never answered),
  ``lose-settlements`` (``{"count": 3}``: receivers' settlements lost), ``disaster``,
  ``fragment-down`` and
  ``fragment-up`` (``{"entity": "orders", "index": 3}``, partitioned entities),
  ``session-lock-lost`` (``{"entity": "orders"}``: every session lock on it is lost now;
  the answer adds ``session_locks_lost``, how many were held)
- ``GET  /namespaces/{ns}/faults``             the namespace's current faults
- ``GET  /namespaces/{ns}/fragments``          partitioned entities with fragments down
- ``POST /namespaces/{ns}/hybrid-connections`` a relay hybrid connection: ``{"name": ...}``
- ``GET  /namespaces/{ns}/relay``              the relay's port, hybrid connections, listeners
- ``POST /namespaces/{ns}/faults/relay-no-listener`` ``{"path": "svc", "on": true}``: the
  relay answers as if no listener were connected to ``path`` (``restore`` ends it)
"""

from __future__ import annotations

__all__ = [
    "FAULTS",
    "Argument",
    "ControlledEmulator",
    "FaultKind",
    "FaultRefused",
    "InvalidArgument",
    "build_control_app",
    "inject_fault",
]

import hmac
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from aiohttp import web

from ._broker import BrokerError, EntityProperties, SubscriptionProperties
from ._faults import SEND_REJECT_CONDITIONS
from ._sas import loopback_hosts
from ._server import NamespaceServer

# Broker refusals as control-endpoint statuses (anything else is a name conflict, 409).
_BROKER_STATUS = {
    "amqp:not-found": 404,
    "amqp:invalid-field": 400,
    "com.microsoft:invalid-operation": 400,
    "amqp:resource-limit-exceeded": 403,
}


class ControlledEmulator(Protocol):
    """The emulator the control endpoint serves (``_runner.EmulatorServer``)."""

    @property
    def namespaces(self) -> Mapping[str, NamespaceServer]:
        """Every namespace's server, by name."""

    @property
    def control_port(self) -> int:
        """The port the control endpoint listens on (read per request: known once bound)."""

    @property
    def control_token(self) -> str:
        """What a control client must send as ``Authorization: Bearer <token>``."""

    def describe(self) -> dict[str, Any]:
        """Every namespace, its port, keys and connection strings (``GET /``)."""


# -- faults --------------------------------------------------------------------------------


class InvalidArgument(ValueError):
    """A fault's argument of the right kind that it still refuses: the message says why,
    after the fault's and the argument's names (``latency seconds must be >= 0``)."""


class FaultRefused(Exception):
    """A fault request the endpoint refuses: the HTTP ``status`` and the message it answers."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Argument:
    """One key of a fault's JSON body."""

    key: str
    shown: str
    """How a refusal shows the value it wants, e.g. ``<number >= 0>``."""
    read: Callable[[Any], Any]
    """The value from the body's. Raises ``TypeError`` or ``ValueError`` when it is not
    one (the refusal shows the body the fault needs), :class:`InvalidArgument` when it is
    one the fault still refuses (the refusal says why)."""
    required: bool = True
    default: Any = None
    """The value when the key is absent (optional arguments only)."""


#: What a fault does to a namespace, given its arguments by key; what it returns is added
#: to the answer (the namespace's faults).
_Apply = Callable[[NamespaceServer, dict[str, Any]], Awaitable[dict[str, Any] | None]]


@dataclass(frozen=True)
class FaultKind:
    """One fault the control endpoint injects: its body's arguments and what it does."""

    apply: _Apply
    arguments: tuple[Argument, ...] = ()

    def needs(self, fault: str) -> str:
        """The refusal for a body without a required argument, or with one that is not one
        (``latency needs {'seconds': <number >= 0>}``)."""
        wanted = ", ".join(f"'{a.key}': {a.shown}" for a in self.arguments if a.required)
        return f"{fault} needs {{{wanted}}}"

    def read(self, fault: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Each argument's value from ``body``.

        Raises:
            FaultRefused: 400, a required argument is missing or one is invalid.
        """
        values: dict[str, Any] = {}
        for argument in self.arguments:
            if argument.key not in body:
                if argument.required:
                    raise FaultRefused(400, self.needs(fault))
                values[argument.key] = argument.default
                continue
            try:
                values[argument.key] = argument.read(body[argument.key])
            except InvalidArgument as exc:
                raise FaultRefused(400, f"{fault} {argument.key} {exc}") from None
            except (TypeError, ValueError):
                refusal = (
                    self.needs(fault)
                    if argument.required
                    else f"{fault} {argument.key} must be {argument.shown}"
                )
                raise FaultRefused(400, refusal) from None
        return values


def _at_least_zero(convert: Callable[[Any], float]) -> Callable[[Any], float]:
    """``convert(value)`` (``int`` or ``float``: numeric text is accepted), if not negative."""

    def read(value: Any) -> float:
        number = convert(value)
        if number < 0:
            raise InvalidArgument("must be >= 0")
        return number

    return read


def _exactly(kind: type) -> Callable[[Any], Any]:
    """The value if it is a ``kind`` (no conversion: an entity name is not a number)."""

    def read(value: Any) -> Any:
        if not isinstance(value, kind):
            raise TypeError(f"not a {kind.__name__}")
        return value

    return read


def _send_rejection(condition: Any) -> str | None:
    if condition is not None and (
        not isinstance(condition, str) or condition not in SEND_REJECT_CONDITIONS
    ):
        raise InvalidArgument(f"must be one of {sorted(SEND_REJECT_CONDITIONS)} or null")
    return condition


def _setting(attribute: str, key: str) -> _Apply:
    """A fault that sets one attribute of the namespace's faults to argument ``key``."""

    async def apply(server: NamespaceServer, arguments: dict[str, Any]) -> None:
        setattr(server.faults, attribute, arguments[key])

    return apply


async def _outage(server: NamespaceServer, arguments: dict[str, Any]) -> None:
    await server.outage()


async def _restore(server: NamespaceServer, arguments: dict[str, Any]) -> None:
    try:
        await server.restore()
    except OSError as exc:  # e.g. the port was taken while the namespace was down
        raise FaultRefused(
            500,
            f"namespace {server.name} could not listen on port {server.port} again "
            f"({exc}); restart the emulator",
        ) from None


async def _blackhole(server: NamespaceServer, arguments: dict[str, Any]) -> None:
    server.blackhole()


async def _disaster(server: NamespaceServer, arguments: dict[str, Any]) -> None:
    await server.disaster()


async def _fragment_down(server: NamespaceServer, arguments: dict[str, Any]) -> None:
    server.fragment_down(arguments["entity"], arguments["index"])


async def _fragment_up(server: NamespaceServer, arguments: dict[str, Any]) -> None:
    server.fragment_up(arguments["entity"], arguments["index"])


async def _session_lock_lost(server: NamespaceServer, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"session_locks_lost": server.namespace.expire_session_locks(arguments["entity"])}


async def _relay_no_listener(server: NamespaceServer, arguments: dict[str, Any]) -> None:
    path = arguments["path"]
    if server.relay is None:
        raise FaultRefused(400, f"namespace {server.name} has no relay")
    if path not in server.relay.hybrid_connections:
        raise FaultRefused(404, f"no hybrid connection '{path}' in this namespace")
    if arguments["on"]:
        server.relay.no_listener.add(path)
    else:
        server.relay.no_listener.discard(path)


_FRAGMENT = (
    Argument("entity", "<name>", _exactly(str)),
    Argument("index", "<0..15>", _exactly(int)),
)

#: Every fault ``POST /namespaces/{ns}/faults/{fault}`` injects (a new one is one row).
#: Its answer is the namespace's faults (``GET .../faults``) after it, plus what it adds.
FAULTS: dict[str, FaultKind] = {
    "outage": FaultKind(_outage),
    "restore": FaultKind(_restore),
    "blackhole": FaultKind(_blackhole),
    "latency": FaultKind(
        _setting("latency", "seconds"),
        (Argument("seconds", "<number >= 0>", _at_least_zero(float)),),
    ),
    "reject-sends": FaultKind(
        _setting("reject_sends", "condition"),
        (Argument("condition", "<condition or null>", _send_rejection, required=False),),
    ),
    "drop-dispositions": FaultKind(
        _setting("dropped_dispositions", "count"),
        (Argument("count", "<int >= 0>", _at_least_zero(int)),),
    ),
    "lose-settlements": FaultKind(
        _setting("lost_settlements", "count"),
        (Argument("count", "<int >= 0>", _at_least_zero(int)),),
    ),
    "disaster": FaultKind(_disaster),
    "fragment-down": FaultKind(_fragment_down, _FRAGMENT),
    "fragment-up": FaultKind(_fragment_up, _FRAGMENT),
    "session-lock-lost": FaultKind(
        _session_lock_lost, (Argument("entity", "<queue or subscription>", _exactly(str)),)
    ),
    "relay-no-listener": FaultKind(
        _relay_no_listener,
        (
            Argument("path", "<hybrid connection>", _exactly(str)),
            Argument("on", "<true or false>", bool, required=False, default=True),
        ),
    ),
}


async def inject_fault(
    server: NamespaceServer, fault: str, body: Mapping[str, Any]
) -> dict[str, Any]:
    """Inject ``fault`` with the arguments in ``body``; the namespace's faults after it.

    Raises:
        FaultRefused: 404 for an unknown fault, 400 for a missing or invalid argument,
            the broker's status when it refuses (an unknown or unpartitioned entity).
    """
    kind = FAULTS.get(fault)
    if kind is None:
        raise FaultRefused(404, f"unknown fault '{fault}'; one of {', '.join(FAULTS)}")
    arguments = kind.read(fault, body)
    try:
        added = await kind.apply(server, arguments)
    except BrokerError as exc:
        raise FaultRefused(_BROKER_STATUS.get(exc.condition, 400), exc.description) from None
    return {**server.faults.as_dict(), **(added or {})}


# -- entities ------------------------------------------------------------------------------


def _entity_properties(
    kind: str, values: dict[str, Any]
) -> EntityProperties | SubscriptionProperties:
    """Entity properties from plain values (durations in seconds)."""
    converted: dict[str, Any] = {
        k: (timedelta(seconds=v) if _is_duration(k) and isinstance(v, int | float) else v)
        for k, v in values.items()
    }
    if kind == "subscription":
        return SubscriptionProperties(**converted)
    return EntityProperties(**converted)


def _is_duration(name: str) -> bool:
    return name in {
        "lock_duration",
        "default_message_time_to_live",
        "duplicate_detection_history_time_window",
        "auto_delete_on_idle",
    }


def _created(kind: str, create: Callable[[], object]) -> web.Response:
    """201 with the name ``create()`` returns; 400 without a name or with an unknown
    property, the broker's status when it refuses."""
    try:
        name = create()
    except KeyError:
        return _error(400, f"a {kind} needs a 'name'")
    except TypeError as exc:
        return _error(400, f"unknown {kind} property: {exc}")
    except BrokerError as exc:
        return _error(_BROKER_STATUS.get(exc.condition, 409), exc.description)
    return web.json_response({"created": name}, status=201)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def build_control_app(emulator: ControlledEmulator) -> web.Application:
    """The aiohttp application serving the control routes for ``emulator``."""
    routes = web.RouteTableDef()

    def namespace(request: web.Request) -> NamespaceServer:
        name = request.match_info["ns"]
        server = emulator.namespaces.get(name)
        if server is None:
            known = ", ".join(emulator.namespaces)
            raise web.HTTPNotFound(
                text=f'{{"error": "unknown namespace \'{name}\'; this emulator has: {known}"}}',
                content_type="application/json",
            )
        return server

    async def body(request: web.Request) -> dict[str, Any]:
        if not request.can_read_body:
            return {}
        try:
            value = await request.json()
        except ValueError:
            raise web.HTTPBadRequest(
                text='{"error": "the body must be JSON"}', content_type="application/json"
            ) from None
        if not isinstance(value, dict):
            raise web.HTTPBadRequest(
                text='{"error": "the body must be a JSON object"}', content_type="application/json"
            )
        return value

    @routes.get("/")
    async def describe(request: web.Request) -> web.Response:
        return web.json_response(emulator.describe())

    @routes.get("/namespaces/{ns}/entities")
    async def entities(request: web.Request) -> web.Response:
        return web.json_response(namespace(request).describe_entities())

    @routes.get("/namespaces/{ns}/faults")
    async def faults(request: web.Request) -> web.Response:
        return web.json_response(namespace(request).faults.as_dict())

    @routes.get("/namespaces/{ns}/fragments")
    async def fragments(request: web.Request) -> web.Response:
        return web.json_response(namespace(request).namespace.fragments_down())

    @routes.post("/namespaces/{ns}/queues")
    async def create_queue(request: web.Request) -> web.Response:
        server = namespace(request)
        data = await body(request)

        def create() -> object:
            properties = _entity_properties("queue", dict(data.get("properties") or {}))
            server.namespace.create_queue(str(data["name"]), properties)  # type: ignore[arg-type]
            return data["name"]

        return _created("queue", create)

    @routes.post("/namespaces/{ns}/topics")
    async def create_topic(request: web.Request) -> web.Response:
        server = namespace(request)
        data = await body(request)

        def create() -> object:
            name = str(data["name"])
            properties = _entity_properties("topic", dict(data.get("properties") or {}))
            server.namespace.create_topic(name, properties)  # type: ignore[arg-type]
            for subscription in data.get("subscriptions") or ():
                server.namespace.create_subscription(name, str(subscription))
            return name

        return _created("topic", create)

    @routes.get("/namespaces/{ns}/relay")
    async def relay(request: web.Request) -> web.Response:
        server = namespace(request)
        return web.json_response(server.relay.describe() if server.relay else None)

    @routes.post("/namespaces/{ns}/hybrid-connections")
    async def create_hybrid_connection(request: web.Request) -> web.Response:
        server = namespace(request)
        name = str((await body(request)).get("name") or "").strip("/")
        if not name or server.relay is None:
            return _error(400, "a hybrid connection needs a 'name'")
        if name in server.relay.hybrid_connections:
            return _error(409, f"hybrid connection '{name}' already exists")
        server.relay.hybrid_connections.add(name)
        return web.json_response({"created": name}, status=201)

    @routes.post("/namespaces/{ns}/faults/{fault}")
    async def inject(request: web.Request) -> web.Response:
        server = namespace(request)
        data = await body(request)
        try:
            state = await inject_fault(server, request.match_info["fault"], data)
        except FaultRefused as exc:
            return _error(exc.status, exc.message)
        return web.json_response(state)

    app = web.Application(middlewares=[_guard(emulator)])
    app.add_routes(routes)
    return app


_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _guard(emulator: ControlledEmulator) -> Any:
    """The middleware that checks Host, the control token and the content type."""

    @web.middleware
    async def guard(request: web.Request, handler: _Handler) -> web.StreamResponse:
        port = emulator.control_port
        if request.headers.get("Host", "").lower() not in loopback_hosts(port):
            return _error(403, f"the Host must be 127.0.0.1:{port} or localhost:{port}")
        supplied = request.headers.get("Authorization", "").encode()
        expected = f"Bearer {emulator.control_token}".encode()
        if not hmac.compare_digest(supplied, expected):
            return _error(
                401,
                "send the control token as 'Authorization: Bearer <token>' (georep emulator "
                "prints it; Emulator.control_token; georep fault --control-token or "
                "$GEOREP_EMULATOR_CONTROL_TOKEN)",
            )
        if request.method not in ("GET", "HEAD") and request.content_type != "application/json":
            return _error(415, "the body must be application/json")
        return await handler(request)

    return guard
