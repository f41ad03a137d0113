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
- ``POST /namespaces/{ns}/faults/{fault}``     ``outage``, ``restore``, ``blackhole``,
  ``latency`` (``{"seconds": 0.2}``), ``reject-sends`` (``{"condition": "server-busy"}``),
  ``drop-dispositions`` (``{"count": 3}``), ``disaster``, ``fragment-down`` and
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

import hmac
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web

from ._broker import BrokerError
from ._sas import loopback_hosts
from ._server import (
    SEND_REJECT_CONDITIONS,
    NamespaceServer,
    default_properties,
)

if TYPE_CHECKING:
    from ._server import EmulatorServer

__all__ = ["FAULTS", "build_control_app"]

FAULTS = (
    "outage",
    "restore",
    "blackhole",
    "latency",
    "reject-sends",
    "drop-dispositions",
    "disaster",
    "fragment-down",
    "fragment-up",
    "session-lock-lost",
    "relay-no-listener",
)

# Broker refusals as control-endpoint statuses (anything else is a name conflict, 409).
_BROKER_STATUS = {
    "amqp:not-found": 404,
    "amqp:invalid-field": 400,
    "com.microsoft:invalid-operation": 400,
    "amqp:resource-limit-exceeded": 403,
}

_N = TypeVar("_N", int, float)

#: Faults set by one number >= 0: fault -> (body key, type, NamespaceFaults attribute,
#: message when the key is missing or not a number, message when it is negative).
_NUMBER_FAULTS: dict[str, tuple[str, type[int] | type[float], str, str, str]] = {
    "latency": ("seconds", float, "latency", "latency needs {'seconds': <number >= 0>}",
                "latency seconds must be >= 0"),
    "drop-dispositions": ("count", int, "dropped_dispositions",
                          "drop-dispositions needs {'count': <int >= 0>}", "count must be >= 0"),
}  # fmt: skip


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


def _non_negative(
    data: Any, key: str, convert: Callable[[Any], _N], needs: str, negative: str
) -> _N | web.Response:
    """``convert(data[key])`` if it is a number >= 0, else the 400 response to return."""
    try:
        value = convert(data[key])
    except (KeyError, TypeError, ValueError):
        return _error(400, needs)
    if value < 0:
        return _error(400, negative)
    return value


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def build_control_app(emulator: EmulatorServer) -> web.Application:
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
            properties = default_properties("queue", dict(data.get("properties") or {}))
            server.namespace.create_queue(str(data["name"]), properties)  # type: ignore[arg-type]
            return data["name"]

        return _created("queue", create)

    @routes.post("/namespaces/{ns}/topics")
    async def create_topic(request: web.Request) -> web.Response:
        server = namespace(request)
        data = await body(request)

        def create() -> object:
            name = str(data["name"])
            properties = default_properties("topic", dict(data.get("properties") or {}))
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
        fault = request.match_info["fault"]
        data = await body(request)
        if fault == "outage":
            await server.outage()
        elif fault == "restore":
            try:
                await server.restore()
            except OSError as exc:  # e.g. the port was taken while the namespace was down
                message = (
                    f"namespace {server.name} could not listen on port {server.port} again "
                    f"({exc}); restart the emulator"
                )
                return web.json_response({"error": message}, status=500)
        elif fault == "blackhole":
            server.blackhole()
        elif fault == "disaster":
            await server.disaster()
        elif fault in _NUMBER_FAULTS:
            key, convert, attribute, needs, negative = _NUMBER_FAULTS[fault]
            value = _non_negative(data, key, convert, needs, negative)
            if isinstance(value, web.Response):
                return value
            setattr(server.faults, attribute, value)
        elif fault == "reject-sends":
            condition = data.get("condition")
            if condition is not None and condition not in SEND_REJECT_CONDITIONS:
                return _error(
                    400, f"condition must be one of {sorted(SEND_REJECT_CONDITIONS)} or null"
                )
            server.faults.reject_sends = condition
        elif fault in ("fragment-down", "fragment-up"):
            entity, index = data.get("entity"), data.get("index")
            if not isinstance(entity, str) or not isinstance(index, int):
                return _error(400, f"{fault} needs {{'entity': <name>, 'index': <0..15>}}")
            try:
                if fault == "fragment-down":
                    server.fragment_down(entity, index)
                else:
                    server.fragment_up(entity, index)
            except BrokerError as exc:
                return _error(_BROKER_STATUS.get(exc.condition, 400), exc.description)
        elif fault == "session-lock-lost":
            entity = data.get("entity")
            if not isinstance(entity, str):
                return _error(400, "session-lock-lost needs {'entity': <queue or subscription>}")
            try:
                lost = server.namespace.expire_session_locks(entity)
            except BrokerError as exc:
                return _error(_BROKER_STATUS.get(exc.condition, 400), exc.description)
            return web.json_response({**server.faults.as_dict(), "session_locks_lost": lost})
        elif fault == "relay-no-listener":
            path = data.get("path")
            if not isinstance(path, str) or server.relay is None:
                return _error(400, "relay-no-listener needs {'path': <hybrid connection>}")
            if path not in server.relay.hybrid_connections:
                return _error(404, f"no hybrid connection '{path}' in this namespace")
            if data.get("on", True):
                server.relay.no_listener.add(path)
            else:
                server.relay.no_listener.discard(path)
        else:
            return _error(404, f"unknown fault '{fault}'; one of {', '.join(FAULTS)}")
        return web.json_response(server.faults.as_dict())

    app = web.Application(middlewares=[_guard(emulator)])
    app.add_routes(routes)
    return app


_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _guard(emulator: EmulatorServer) -> Any:
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
