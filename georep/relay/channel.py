"""Relay endpoint failover: one service, two endpoints, a random active one (SPEC §2.5).

A service listens on two relay endpoints in different namespaces (with different names).
:class:`FailoverChannel` picks one at random on first use, sends there, and on a failure
that says the endpoint is unavailable reissues the request to the other one and swaps the
roles for every user of the channel. Answers from the service, whatever their status, are
returned as they are.
"""

from __future__ import annotations

__all__ = ["DEFAULT_RELAY_FAILOVER_KINDS", "FailoverChannel", "RelayChannelStats", "RelayPolicy"]

import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from opentelemetry import metrics, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from georep._channel import RegionChannel
from georep._classify import RELAY_FAILOVER_KINDS
from georep._clock import SystemClock
from georep._lifecycle import AsyncResource, close_all
from georep._policy import Seconds, as_seconds, error_kinds, positive_seconds
from georep._region_wrap import check_pair
from georep._telemetry import Instruments, InstrumentSpec, TracingGate
from georep.exceptions import (
    AllRegionsUnavailableError,
    ConfigurationError,
    RegionError,
    RegionTimeoutError,
)
from georep.ports import Clock, ErrorKind, RelayEndpoint, RelayResponse, RoleStore
from georep.roles.join import role_join
from georep.roles.state import RoleSnapshot, RoleState

#: Relay failures that mean "this endpoint is unavailable" (SPEC §2.5): connection errors
#: and timeouts, gateway errors (HTTP 502/503/504, handshake 500, close 1011), and a
#: handshake the relay refused (401/403: the namespace's keys or rules changed; 404: no
#: such hybrid connection or no listener). Read from the one classification table
#: (``georep._classify.RELAY_FAILOVER_KINDS``, where the choice is argued).
DEFAULT_RELAY_FAILOVER_KINDS: frozenset[ErrorKind] = RELAY_FAILOVER_KINDS

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


@dataclass(frozen=True, kw_only=True)
class RelayPolicy:
    """When a :class:`FailoverChannel` fails over, and how long it waits.

    Attributes:
        fail_over_on: Error kinds that send the request to the other endpoint. Anything
            else is raised at once. Default: :data:`DEFAULT_RELAY_FAILOVER_KINDS`.
        attempt_timeout: Seconds (``float`` or ``timedelta``) one endpoint gets for one
            request, connection setup included. Default 10.
        request_timeout: Seconds a whole :meth:`FailoverChannel.request` may take, both
            attempts included; a ``timeout=`` argument overrides it per call. Default 30.

    Raises:
        ConfigurationError: A timeout is not a finite number of seconds > 0, or
            ``fail_over_on`` names an unknown kind (the message names the field).
    """

    fail_over_on: frozenset[ErrorKind] = DEFAULT_RELAY_FAILOVER_KINDS
    attempt_timeout: Seconds = 10.0
    request_timeout: Seconds = 30.0

    def __post_init__(self) -> None:
        for name in ("attempt_timeout", "request_timeout"):
            object.__setattr__(
                self, name, positive_seconds(getattr(self, name), f"RelayPolicy.{name}")
            )
        kinds = error_kinds(self.fail_over_on, "RelayPolicy.fail_over_on")
        object.__setattr__(self, "fail_over_on", kinds)


@dataclass(slots=True)
class RelayChannelStats:
    """Counters of one :class:`FailoverChannel` (plain ints, read any time).

    Attributes:
        requests: Calls to ``request`` that returned an answer.
        failovers: Requests reissued to the backup after the active endpoint failed.
        role_swaps: Times the active and backup endpoints swapped roles.
        failures: Requests that raised (both endpoints failed, or a non-failover error).
    """

    requests: int = 0
    failovers: int = 0
    role_swaps: int = 0
    failures: int = 0


class _Call(NamedTuple):
    """One ``request`` call: what is sent, when it started, its whole budget (seconds)."""

    method: str
    path: str
    body: bytes
    headers: dict[str, str]
    started: float
    total: float


# Attribute dicts built once: the request path stays within a few microseconds.
_OUTCOMES = {outcome: {"georep.outcome": outcome} for outcome in ("ok", "failed")}


RELAY_COUNTERS: Final = {
    "failovers": InstrumentSpec(
        "georep.relay.failovers",
        "{request}",
        "Relay requests reissued to the backup endpoint after the active failed.",
    ),
    "role_swaps": InstrumentSpec(
        "georep.relay.role_swaps",
        "{swap}",
        "Times the active and backup relay endpoints swapped roles.",
    ),
}
"""The failover channel's counters."""

RELAY_DURATION: Final = InstrumentSpec(
    "georep.relay.request.duration",
    "s",
    "Duration of FailoverChannel.request calls, failover included.",
)


class _ChannelTelemetry:
    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None,
        meter_provider: metrics.MeterProvider | None,
        monotonic: Any,
    ) -> None:
        from georep import __version__

        self.tracer = trace.get_tracer("georep", __version__, tracer_provider)
        self.tracing = TracingGate(tracer_provider, monotonic)
        # Shared per provider: instruments created per instance would pile up.
        meter = Instruments.of(meter_provider)
        self._counters = meter.counters(RELAY_COUNTERS)
        self._duration = meter.histogram_of(RELAY_DURATION)

    def failover(self, from_region: str, to_region: str) -> None:
        self._counters["failovers"].add(1, {"georep.from": from_region, "georep.to": to_region})

    def swap(self, new_active: str) -> None:
        self._counters["role_swaps"].add(1, {"georep.region": new_active})

    def duration(self, seconds: float, outcome: str) -> None:
        self._duration.record(seconds, _OUTCOMES[outcome])


class FailoverChannel(AsyncResource):
    """Requests to a service exposed on two relay endpoints, failing over between them.

    Share one channel among every caller of the service: the roles (which endpoint is
    active) live in the channel, and a burst of concurrent failures swaps them once.
    Endpoints open their connections on first use, so the backup costs nothing until a
    failover needs it. Closing the channel (``async with`` or :meth:`aclose`) closes both
    endpoints; pass ``close_endpoints=False`` to :meth:`aclose` to keep them.

    A request that failed on the active endpoint may still have reached the service (the
    connection dropped after sending): the reissue to the backup can then run it twice.
    Make handlers idempotent, e.g. keyed by a request id header.

    Example::

        channel = FailoverChannel((primary_endpoint, secondary_endpoint))
        response = await channel.request("POST", "/orders", body=b"{...}")

    Args:
        endpoints: The two endpoints, each with a distinct ``region`` label.
        policy: Failover kinds and timeouts (:class:`RelayPolicy`).
        rng: Random source for the initial pick (seed it in tests); default
            ``random.SystemRandom()``.
        role_state: Share roles with other channels to the same service (each gets its
            own endpoints): pass one :class:`georep.RoleState` whose ``active`` is one of
            the labels, e.g. ``RoleState(random.choice(["primary", "secondary"]))``.
            Default: the channel's own, picked at random on first use.
        role_store: Share the roles with every process of the application (e.g.
            ``georep.adapters.redis.RedisRoleStore``), under ``role_entity``: a failover
            seen by one process moves them all, and ``georep failover``/``pin`` steer them
            (label the endpoints ``primary`` and ``secondary`` for that). The caller owns
            the store.
        role_entity: The service's name in the role store (``georep status`` shows it).
        clock: Time source (``georep.testing.FakeClock`` in tests).
        tracer_provider: OpenTelemetry tracer provider; default the global one.
        meter_provider: OpenTelemetry meter provider; default the global one.

    Raises:
        ConfigurationError: Not exactly two endpoints, both with the same label or
            address, a ``role_state`` naming neither, both ``role_state`` and
            ``role_store``, or a ``role_store`` without ``role_entity``.
    """

    def __init__(
        self,
        endpoints: tuple[RelayEndpoint, RelayEndpoint],
        *,
        policy: RelayPolicy | None = None,
        rng: random.Random | None = None,
        role_state: RoleState | None = None,
        role_store: RoleStore | None = None,
        role_entity: str | None = None,
        clock: Clock | None = None,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        if role_store is not None and (role_state is not None or not role_entity):
            raise ConfigurationError(
                "role_store= needs role_entity= (the service's name in the store) and "
                "excludes role_state="
            )
        if len(endpoints) != 2:
            raise ConfigurationError(
                f"FailoverChannel needs exactly two endpoints (active and backup), "
                f"got {len(endpoints)}"
            )
        check_pair(
            *endpoints,
            what="endpoints",
            where="address",
            needs="the backup must be another endpoint, in another namespace",
        )
        self._endpoints = {endpoint.region: endpoint for endpoint in endpoints}
        self._policy = policy or RelayPolicy()
        self._rng = rng or random.SystemRandom()
        self._clock: Clock = clock or SystemClock()
        # Requests run concurrently on an endpoint: no slot.
        self._channels = {
            endpoint.region: RegionChannel(
                endpoint,
                clock=self._clock,
                fail_over_on=self._policy.fail_over_on,
                exclusive=False,
            )
            for endpoint in endpoints
        }
        self._close_endpoints = True
        if role_state is not None and role_state.current.active not in self._endpoints:
            raise ConfigurationError(
                f"role_state has {role_state.current.active!r} active, which is neither "
                f"endpoint ({', '.join(sorted(self._endpoints))}): label the endpoints alike"
            )
        self._roles: RoleState | None = role_state
        labels = {label: label for label in self._endpoints}
        self._role_join = role_join(
            role_store, role_entity or "", labels, clock=self._clock, meter_provider=meter_provider
        )
        self._telemetry = _ChannelTelemetry(tracer_provider, meter_provider, time.monotonic)
        self.stats = RelayChannelStats()

    # -- roles -------------------------------------------------------------------------
    def _role_state(self) -> RoleState:
        if self._roles is None:
            # The initial pick is random on purpose (SPEC §2.5): clients spread over both
            # endpoints instead of all piling onto the first one listed. With a role
            # store, the first process's pick becomes everyone's.
            pick = self._rng.choice(sorted(self._endpoints))
            join = self._role_join
            self._roles = RoleState(pick) if join is None else join.state(pick)
        return self._roles

    async def _open(self) -> None:
        roles = self._role_state()  # joins the shared roles, if any
        if roles.shared is None and self._role_join is not None:
            await self._role_join.refresh()

    @property
    def active(self) -> str:
        """The active endpoint's label (picks it, at random, when nothing was sent yet)."""
        return self._role_state().current.active

    @property
    def backup(self) -> str:
        """The backup endpoint's label."""
        return self._other(self.active)

    def _other(self, region: str) -> str:
        return next(name for name in self._endpoints if name != region)

    # -- requests ------------------------------------------------------------------------
    async def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | str = b"",
        headers: Mapping[str, str] | None = None,
        timeout: Seconds | None = None,
    ) -> RelayResponse:
        """Send a request to the active endpoint; on unavailability, to the backup.

        Args:
            method: HTTP method (``GET``, ``POST``...).
            path: Path and query below the endpoint, starting with ``/``.
            body: Request body (``str`` is sent as UTF-8).
            headers: Request headers.
            timeout: Seconds for the whole call, both attempts included; default
                ``policy.request_timeout``.

        Returns:
            The service's answer (any status); ``response.region`` names who answered.

        Raises:
            AllRegionsUnavailableError: Both endpoints failed; ``causes`` holds each
                endpoint's error by label. Roles are unchanged.
            RegionError: The active endpoint failed with a kind the policy does not fail
                over on (no request was sent to the backup).
            ConfigurationError: Bad method, path or timeout.
            ClosedError: The channel was closed.
        """
        self._check_open()
        call = self._call(method.upper(), path, body, headers, timeout)
        method = call.method
        if not self._telemetry.tracing():
            return await self._request(call)
        with self._telemetry.tracer.start_as_current_span(
            f"{method} {path.split('?', 1)[0]}",
            kind=SpanKind.CLIENT,
            attributes={"http.request.method": method, "georep.relay": True},
        ) as span:
            try:
                response = await self._request(call)
            except Exception as exc:
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                raise
            span.set_attribute("georep.region", response.region)
            span.set_attribute("http.response.status_code", response.status)
            return response

    def _call(
        self,
        method: str,
        path: str,
        body: bytes | str,
        headers: Mapping[str, str] | None,
        timeout: Seconds | None,
    ) -> _Call:
        """The checked request, its budget starting now."""
        if method not in _METHODS:
            raise ConfigurationError(
                f"unsupported method {method!r}: use one of {sorted(_METHODS)}"
            )
        if not path.startswith("/"):
            raise ConfigurationError(f"path {path!r} must start with '/' (e.g. '/orders')")
        payload = body.encode() if isinstance(body, str) else body
        if type(payload) is not bytes:
            payload = bytes(payload)
        total = (
            as_seconds(self._policy.request_timeout)
            if timeout is None
            else positive_seconds(timeout, "timeout")
        )
        return _Call(method, path, payload, dict(headers or {}), self._clock.monotonic(), total)

    async def _request(self, call: _Call) -> RelayResponse:
        roles = self._role_state()
        snapshot = roles.read_now() or await roles.read()
        try:
            response = await self._attempt(snapshot.active, call)
        except RegionError as first:
            if first.kind not in self._policy.fail_over_on:
                self._finish(call.started, "failed")
                raise
            return await self._fail_over(snapshot, first, call)
        self._finish(call.started, "ok")
        return response

    async def _fail_over(
        self, snapshot: RoleSnapshot, first: RegionError, call: _Call
    ) -> RelayResponse:
        active = snapshot.active
        backup = self._other(active)
        self.stats.failovers += 1
        self._telemetry.failover(active, backup)
        trace.get_current_span().add_event(
            "georep.failover",
            {"georep.from": active, "georep.to": backup, "error.type": first.kind.value},
        )
        trace.get_current_span().set_attribute("georep.failover", True)
        try:
            response = await self._attempt(backup, call)
        except RegionError as second:
            self._finish(call.started, "failed")
            raise AllRegionsUnavailableError(
                "both relay endpoints failed", {active: first, backup: second}
            ) from second
        assert self._roles is not None
        if await self._roles.swap(expected=snapshot, new_active=backup):
            self.stats.role_swaps += 1
            self._telemetry.swap(backup)
        self._finish(call.started, "ok")
        return response

    async def _attempt(self, region: str, call: _Call) -> RelayResponse:
        remaining = call.total - (self._clock.monotonic() - call.started)
        if remaining <= 0:
            raise RegionTimeoutError(
                f"no time left for {region} (request timeout {call.total:g} s)",
                region=region,
                kind=ErrorKind.TIMEOUT,
            )
        seconds = min(as_seconds(self._policy.attempt_timeout), remaining)
        channel = self._channels[region]
        response = await channel.call(
            seconds,
            channel.client.request,
            call.method,
            call.path,
            body=call.body,
            headers=call.headers,
        )
        if response.region != region:
            response = RelayResponse(response.status, response.headers, response.body, region)
        return response

    def _finish(self, started: float, outcome: str) -> None:
        if outcome == "ok":
            self.stats.requests += 1
        else:
            self.stats.failures += 1
        self._telemetry.duration(self._clock.monotonic() - started, outcome)

    # -- lifecycle ---------------------------------------------------------------------------
    async def aclose(self, *, close_endpoints: bool = True) -> None:
        """Close the channel (idempotent) and, by default, both endpoints."""
        if not self.closed:
            self._close_endpoints = close_endpoints
        await super().aclose()

    async def _close(self) -> None:
        if self._role_join is not None:
            await self._role_join.release()
        if self._close_endpoints:
            await close_all(
                self._endpoints.values(),
                timeout=as_seconds(self._policy.attempt_timeout),
                clock=self._clock,
                what="relay endpoint",
            )
