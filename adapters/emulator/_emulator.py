"""The emulator as a Python object: start it, get connection strings, inject faults.

The emulator runs in a child process, so the AMQP server never competes with the code
under test for the GIL and a sync SDK client cannot deadlock it. Control calls go to the
child's loopback HTTP control endpoint and return once the fault is in force.
"""

from __future__ import annotations

__all__ = ["Emulator", "NamespaceControl", "SendRejection"]

import asyncio
import io
import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, Self

from georep.exceptions import EmulatorError

from ._entra import AUDIENCE, AsyncEmulatorTokenCredential, EmulatorTokenCredential

if TYPE_CHECKING:
    from georep.adapters.relay import HybridConnection

if TYPE_CHECKING:
    from azure.servicebus.aio.management import ServiceBusAdministrationClient as AsyncAdminClient
    from azure.servicebus.management import ServiceBusAdministrationClient

SendRejection = Literal["server-busy", "timeout", "internal-error", "quota-exceeded"]
_CONTROL_TIMEOUT = 10.0


class NamespaceControl:
    """One emulated namespace: its connection string and its faults.

    Every fault call returns once the fault is in force and lasts until :meth:`restore`.
    """

    def __init__(
        self,
        emulator: Emulator,
        name: str,
        port: int,
        connection_string: str,
        relay_port: int = 0,
    ) -> None:
        self._emulator = emulator
        self.name = name
        self.port = port
        self.connection_string = connection_string
        self.relay_port = relay_port
        """The Hybrid Connections relay's TLS port (``wss://``/``https://``)."""
        fields = dict(part.split("=", 1) for part in connection_string.split(";") if "=" in part)
        self.key_name = fields.get("SharedAccessKeyName", "")
        """The shared access policy name, for minting SAS tokens."""
        self._key = fields.get("SharedAccessKey", "")
        self._rules: dict[str, dict[str, Any]] = {}

    def connection_string_for(self, rule: str) -> str:
        """The connection string of the authorization rule ``rule``.

        Every namespace has ``RootManageSharedAccessKey`` (Manage, Send, Listen),
        ``SendOnly`` (Send) and ``ListenOnly`` (Listen).
        """
        try:
            return str(self._rules[rule]["connection_string"])
        except KeyError:
            raise EmulatorError(
                f"namespace '{self.name}' has no rule '{rule}'; it has {', '.join(self._rules)}"
            ) from None

    @property
    def key(self) -> str:
        """The namespace's shared access key (mint tokens with it; never log it)."""
        return self._key

    @property
    def relay_host(self) -> str:
        """The relay's host and port, what Azure calls the namespace host name."""
        return f"127.0.0.1:{self.relay_port}"

    def hybrid_connection(self, path: str, *, region: str | None = None) -> HybridConnection:
        """A :class:`georep.adapters.relay.HybridConnection` for ``path`` in this namespace.

        Args:
            path: The hybrid connection's name.
            region: Its label; default this namespace's name.
        """
        from georep.adapters.relay import HybridConnection

        return HybridConnection(
            namespace=self.relay_host,
            path=path,
            key_name=self.key_name,
            key=self._key,
            region=region or self.name,
        )

    def create_hybrid_connection(self, name: str) -> None:
        """Create a relay hybrid connection named ``name`` in this namespace."""
        self._emulator._call("POST", f"/namespaces/{self.name}/hybrid-connections", {"name": name})

    def relay_no_listener(self, path: str, on: bool = True) -> None:
        """Answer senders of ``path`` as if no listener were connected (until ``on=False``
        or :meth:`restore`): HTTP 503 and websocket handshake 404, "There are no listeners
        connected for the endpoint"."""
        self._fault("relay-no-listener", {"path": path, "on": on})

    def relay(self) -> dict[str, Any]:
        """The relay's port, hybrid connections, connected listeners and faults."""
        result: dict[str, Any] = self._emulator._call("GET", f"/namespaces/{self.name}/relay")
        return result

    def __repr__(self) -> str:  # never show the key
        return f"NamespaceControl(name={self.name!r}, port={self.port})"

    def _fault(self, fault: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = self._emulator._call(
            "POST", f"/namespaces/{self.name}/faults/{fault}", body
        )
        return result

    def outage(self) -> None:
        """Refuse connections and drop existing ones (SDK: ``ServiceBusConnectionError``).

        Data is kept. The relay closes its websockets with 1001 and stops listening too.
        """
        self._fault("outage")

    def restore(self) -> None:
        """End every fault; the namespace listens again on the same port."""
        self._fault("restore")

    def blackhole(self) -> None:
        """Accept connections but never answer.

        The SDK raises ``OperationTimeoutError`` after its timeout.
        """
        self._fault("blackhole")

    def latency(self, seconds: float) -> None:
        """Add ``seconds`` to every response of this namespace (0 removes it).

        On the relay: to every relayed request, websocket handshake and sender frame.
        """
        self._fault("latency", {"seconds": seconds})

    def reject_sends(self, condition: SendRejection | None = "server-busy") -> None:
        """Reject every send with ``condition`` (``None`` stops rejecting).

        ``server-busy`` -> ``ServiceBusServerBusyError``, ``timeout`` -> ``OperationTimeoutError``,
        ``internal-error`` -> ``ServiceBusError``,
        ``quota-exceeded`` -> ``ServiceBusQuotaExceededError``.
        """
        self._fault("reject-sends", {"condition": condition})

    def drop_dispositions(self, count: int) -> None:
        """Store the next ``count`` sent messages but never answer their sends.

        The sender times out although the message was stored: the seed's "duplicate
        reception" hazard when the sender then retries elsewhere.
        """
        self._fault("drop-dispositions", {"count": count})

    def lose_settlements(self, count: int) -> None:
        """Lose the next ``count`` settlements receivers send (complete, abandon, defer,
        dead-letter): never applied, never answered, as a disposition frame lost on the
        way. The message stays locked until its lock runs out and is then delivered again
        (a session's, once its session lock is released or runs out)."""
        self._fault("lose-settlements", {"count": count})

    def fragment_down(self, entity: str, index: int) -> None:
        """Take fragment ``index`` (0..15) of the partitioned queue or topic ``entity`` down.

        A keyed send (SessionId, PartitionKey, or MessageId with duplicate detection) whose
        key maps to it is rejected with ``com.microsoft:timeout`` (SDK:
        ``OperationTimeoutError``); unkeyed sends go to the other fragments and succeed;
        its stored messages are not delivered until :meth:`fragment_up` or :meth:`restore`.
        With all 16 down, unkeyed sends fail too.
        """
        self._fault("fragment-down", {"entity": entity, "index": index})

    def fragment_up(self, entity: str, index: int) -> None:
        """Bring fragment ``index`` of ``entity`` back up."""
        self._fault("fragment-up", {"entity": entity, "index": index})

    def expire_session_locks(self, entity: str) -> int:
        """Every session lock held on the session-enabled queue or subscription ``entity``
        (``topic/Subscriptions/sub``) is lost now; how many were held.

        Each holder's link is detached with ``com.microsoft:session-lock-lost``: its next
        receive, settlement or ``session.renew_lock()`` raises ``SessionLockLostError``.
        The sessions are free again (their unsettled messages return, in order) and a new
        receiver can lock them. A one-shot fault: :meth:`restore` has nothing to undo.
        """
        result = self._fault("session-lock-lost", {"entity": entity})
        return int(result["session_locks_lost"])

    def disaster(self) -> None:
        """An outage in which every message of this namespace is lost (entities stay)."""
        self._fault("disaster")

    def faults(self) -> dict[str, Any]:
        """The faults in force now."""
        result: dict[str, Any] = self._emulator._call("GET", f"/namespaces/{self.name}/faults")
        return result

    def fragments_down(self) -> dict[str, list[int]]:
        """Partitioned queues and topics with fragments down, mapped to those fragments."""
        result: dict[str, list[int]] = self._emulator._call(
            "GET", f"/namespaces/{self.name}/fragments"
        )
        return result

    def entities(self) -> dict[str, dict[str, Any]]:
        """Runtime counts per queue and subscription (``active_message_count``, ...)."""
        result: dict[str, dict[str, Any]] = self._emulator._call(
            "GET", f"/namespaces/{self.name}/entities"
        )
        return result

    def message_count(self, entity: str) -> int:
        """Messages stored in ``entity`` (active, locked, deferred, scheduled, dead-lettered)."""
        try:
            return int(self.entities()[entity]["total_message_count"])
        except KeyError:
            raise EmulatorError(
                f"namespace '{self.name}' has no queue or subscription '{entity}'"
            ) from None

    def create_queue(self, name: str, **properties: Any) -> None:
        """Create a queue; ``properties`` are ``QueueProperties`` names, durations in seconds."""
        self._emulator._call(
            "POST", f"/namespaces/{self.name}/queues", {"name": name, "properties": properties}
        )

    def create_topic(self, name: str, subscriptions: Sequence[str] = (), **properties: Any) -> None:
        """Create a topic with subscriptions."""
        self._emulator._call(
            "POST",
            f"/namespaces/{self.name}/topics",
            {"name": name, "subscriptions": list(subscriptions), "properties": properties},
        )


class Emulator:
    """A local multi-region Service Bus, run in a child process.

    Use it as a context manager (sync or async)::

        async with Emulator(namespaces=("primary", "secondary"), queues=("orders",)) as emu:
            conn = emu.connection_string("primary")
            emu.namespace("primary").outage()

    Args:
        namespaces: namespace (region) names; each gets its own loopback port and keys.
        queues: queues created in every namespace.
        session_queues: session-enabled queues (``requires_session=True``) created in
            every namespace.
        topics: topics created in every namespace, mapped to their subscription names.
        hybrid_connections: relay hybrid connections created in every namespace.
        ports: one port per namespace; default: any free port.
        control_port: the HTTP control endpoint's port; default: any free port.
        startup_timeout: seconds to wait for the child to be ready.
    """

    def __init__(
        self,
        namespaces: Sequence[str] = ("primary", "secondary"),
        queues: Sequence[str] = (),
        topics: Mapping[str, Sequence[str]] | None = None,
        *,
        session_queues: Sequence[str] = (),
        hybrid_connections: Sequence[str] = (),
        ports: Sequence[int] | None = None,
        control_port: int = 0,
        startup_timeout: float = 30.0,
    ) -> None:
        if (
            isinstance(namespaces, str)
            or isinstance(queues, str)
            or isinstance(hybrid_connections, str)
            or isinstance(session_queues, str)
        ):
            raise TypeError("namespaces and queues are sequences of names, not a single string")
        if ports is not None and len(ports) != len(namespaces):
            raise ValueError("give one port per namespace")
        self._namespace_names = tuple(namespaces)
        self._queues = tuple(queues)
        self._session_queues = tuple(session_queues)
        self._topics = {k: tuple(v) for k, v in (topics or {}).items()}
        self._hybrid_connections = tuple(hybrid_connections)
        self._ports = tuple(ports) if ports is not None else (0,) * len(self._namespace_names)
        self._control_port = control_port
        self._startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._description: dict[str, Any] | None = None
        self._namespaces: dict[str, NamespaceControl] = {}
        self._stderr: IO[bytes] = io.BytesIO()

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        """Start the child process and wait until every namespace listens.

        Raises:
            EmulatorError: the child failed to start in time (its stderr is in the message).
        """
        if self._process is not None:
            raise EmulatorError("this emulator is already running")
        command = [
            sys.executable,
            "-m",
            "georep.adapters.emulator",
            "--json",
            "--stop-on-stdin-eof",
        ]
        command += ["--control-port", str(self._control_port)]
        for name, port in zip(self._namespace_names, self._ports, strict=True):
            command += ["--namespace", name, "--port", str(port)]
        for queue in self._queues:
            command += ["--queue", queue]
        for queue in self._session_queues:
            command += ["--session-queue", queue]
        for topic, subscriptions in self._topics.items():
            command += ["--topic", f"{topic}:{','.join(subscriptions)}"]
        for path in self._hybrid_connections:
            command += ["--hybrid-connection", path]
        # The child's log goes to a private file, read back only if it fails to start.
        # Kept open for the child's lifetime and closed when it stops, so no ``with`` block.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._process = process
        assert process.stdout is not None
        deadline = time.monotonic() + self._startup_timeout
        line = b""
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if line.startswith(b"{") or process.poll() is not None:
                break
        if not line.startswith(b"{"):
            self._kill()
            self._process = None
            self._stderr.seek(0)
            stderr = self._stderr.read().decode(errors="replace")
            raise EmulatorError(
                f"the emulator did not start: {stderr.strip()[-2000:] or 'no output'}"
            )
        self._description = json.loads(line)
        process.stdout.close()
        for name, info in self._description["namespaces"].items():
            relay = info.get("relay") or {}
            control = NamespaceControl(
                self,
                name,
                int(info["port"]),
                info["connection_string"],
                int(relay.get("port", 0)),
            )
            control._rules = dict(info.get("rules") or {})
            self._namespaces[name] = control

    def stop(self) -> None:
        """Stop the child process (idempotent)."""
        process = self._process
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()  # the child exits on EOF
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._kill()
        self._process = None
        self._stderr.close()

    def _kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(timeout=10)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.to_thread(self.stop)

    # -- access ----------------------------------------------------------------------------
    def _require(self) -> dict[str, Any]:
        if self._description is None or self._process is None:
            raise EmulatorError(
                "the emulator is not running: use it as a context manager or call start()"
            )
        return self._description

    @property
    def namespaces(self) -> tuple[str, ...]:
        return self._namespace_names

    @property
    def control_url(self) -> str:
        return str(self._require()["control_url"])

    @property
    def control_token(self) -> str:
        """The control endpoint's token: send ``Authorization: Bearer <token>``."""
        return str(self._require()["control_token"])

    def control_headers(self) -> dict[str, str]:
        """The headers every control request needs (token and JSON content type)."""
        return {
            "Authorization": f"Bearer {self.control_token}",
            "Content-Type": "application/json",
        }

    @property
    def ca_file(self) -> Path:
        """The emulator's self-signed certificate, for the admin client's ``connection_verify``."""
        return Path(self._require()["ca_file"])

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context that trusts the emulator's certificate (relay, admin)."""
        return ssl.create_default_context(cafile=str(self.ca_file))

    @property
    def entra_key_file(self) -> Path:
        """The key the emulator's Entra ID test credentials sign with (mode 0600)."""
        return Path(self._require()["entra_key_file"])

    def token_credential(
        self, role: str = "owner", *, lifetime: float = 3600.0, audience: str = AUDIENCE
    ) -> EmulatorTokenCredential:
        """A sync ``TokenCredential`` standing in for Microsoft Entra ID (see ``_entra``).

        Args:
            role: ``"owner"``, ``"sender"`` or ``"receiver"`` (the Azure Service Bus Data
                roles), or a full role name.
            lifetime: Seconds each token lives; negative makes expired tokens.
            audience: The tokens' audience; another than Service Bus's is refused.
        """
        return EmulatorTokenCredential(
            self.entra_key_file, role=role, lifetime=lifetime, audience=audience
        )

    def async_token_credential(
        self, role: str = "owner", *, lifetime: float = 3600.0, audience: str = AUDIENCE
    ) -> AsyncEmulatorTokenCredential:
        """The ``AsyncTokenCredential`` form of :meth:`token_credential`."""
        return AsyncEmulatorTokenCredential(
            self.entra_key_file, role=role, lifetime=lifetime, audience=audience
        )

    def client_options(self, name: str, *, tls: bool = True) -> dict[str, Any]:
        """Keyword arguments for ``ServiceBusClient(credential=..., **options)`` (or the admin
        client's) that reach namespace ``name`` with a credential instead of a connection
        string.

        With ``tls`` (the default): AMQPS, as the standard constructor connects to Azure
        (``fully_qualified_namespace`` ``NAME.localhost``, ``custom_endpoint_address`` for
        the port,
        ``connection_verify`` for the emulator's CA, ``transport_type``). Note that the SDK
        reports an authentication failure on a custom endpoint as
        ``ServiceBusConnectionError``. Without: plain AMQP on the namespace's port
        (``use_tls=False``, what ``UseDevelopmentEmulator=true`` connection strings do),
        where it raises ``ServiceBusAuthenticationError`` as against Azure.
        """
        port = self.namespace(name).port
        if not tls:
            return {"fully_qualified_namespace": f"127.0.0.1:{port}", "use_tls": False}
        from azure.servicebus import TransportType

        return {
            # One host name per namespace, as on Azure (never resolved: the SDK connects to
            # custom_endpoint_address); the emulator takes it in token audiences.
            "fully_qualified_namespace": f"{name}.localhost",
            "custom_endpoint_address": f"sb://127.0.0.1:{port}",
            "connection_verify": str(self.ca_file),
            "transport_type": TransportType.Amqp,
        }

    @property
    def pid(self) -> int:
        return int(self._require()["pid"])

    @property
    def running(self) -> bool:
        """Whether the emulator's process was started by :meth:`start` and has not exited
        (a process killed from outside counts as stopped)."""
        return self._process is not None and self._process.poll() is None

    def namespace(self, name: str) -> NamespaceControl:
        self._require()
        try:
            return self._namespaces[name]
        except KeyError:
            raise EmulatorError(
                f"unknown namespace '{name}'; this emulator has {', '.join(self._namespaces)}"
            ) from None

    def connection_string(self, name: str) -> str:
        """The namespace's connection string (``UseDevelopmentEmulator=true``, plain AMQP)."""
        return self.namespace(name).connection_string

    def admin_client(self, name: str) -> ServiceBusAdministrationClient:
        """A sync ``ServiceBusAdministrationClient`` for ``name``.

        It trusts the emulator's self-signed certificate.
        """
        from azure.servicebus.management import ServiceBusAdministrationClient

        return ServiceBusAdministrationClient.from_connection_string(
            self.connection_string(name), connection_verify=str(self.ca_file)
        )

    def async_admin_client(self, name: str) -> AsyncAdminClient:
        """An async ``ServiceBusAdministrationClient`` (needs aiohttp) for ``name``."""
        from azure.servicebus.aio.management import ServiceBusAdministrationClient as AsyncAdmin

        return AsyncAdmin.from_connection_string(
            self.connection_string(name), connection_verify=str(self.ca_file)
        )

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        url = self.control_url + path
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            url, data=data, method=method, headers=self.control_headers()
        )
        try:
            with urllib.request.urlopen(request, timeout=_CONTROL_TIMEOUT) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read()).get("error", str(exc))
            except ValueError:
                message = str(exc)
            raise EmulatorError(f"emulator control {method} {path} failed: {message}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise EmulatorError(
                f"emulator control endpoint unreachable ({exc}); is the emulator still running?"
            ) from None
