"""Run the emulator in the foreground: every namespace's server and the control endpoint.

Entry point of ``python -m georep.adapters.emulator`` and ``georep emulator``. The top of
the emulator's modules: :class:`EmulatorServer` starts each namespace's server
(``_server``), its admin API (``_admin``) and relay (``_relay``), and the HTTP control
endpoint (``_control``), all on one event loop.
"""

from __future__ import annotations

__all__ = [
    "PRINT_FORMATS",
    "EmulatorServer",
    "build_specs",
    "environment_lines",
    "main",
    "parse_topic",
    "run",
    "serve",
]

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import secrets
import shlex
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from georep._signals import stop_on_signals

from ._admin import build_admin_app
from ._admin_backend import NamespaceAdminBackend
from ._control import build_control_app
from ._entra import load_signing_key, make_signing_key
from ._errors import BrokerError
from ._relay import RelayServer
from ._server import (
    CONTROL_TOKEN_ENV,
    DEFAULT_CONTROL_PORT,
    DEFAULT_PORTS,
    NamespaceServer,
    NamespaceSpec,
)
from ._tls import make_self_signed_certificate, server_ssl_context

PRINT_FORMATS: Final = ("text", "json", "env")
"""What ``--print`` takes: text for people, one JSON line, or ``export`` lines."""


def parse_topic(text: str) -> tuple[str, tuple[str, ...]]:
    """``"events:audit,billing"`` -> ``("events", ("audit", "billing"))``."""
    name, _, subscriptions = text.partition(":")
    if not name:
        raise ValueError(f"topic '{text}' needs a name, as NAME or NAME:SUB1,SUB2")
    return name, tuple(s for s in subscriptions.split(",") if s)


def build_specs(
    namespaces: Sequence[str],
    ports: Sequence[int],
    queues: Sequence[str],
    topics: Sequence[str],
    hybrid_connections: Sequence[str] = (),
    session_queues: Sequence[str] = (),
) -> list[NamespaceSpec]:
    """One spec per namespace; every namespace gets the same entities (a geo pair)."""
    if ports and len(ports) != len(namespaces):
        raise ValueError(
            f"give one port per namespace: {len(namespaces)} namespaces, {len(ports)} ports"
        )
    parsed = [parse_topic(t) for t in topics]
    _check_names(queues, session_queues, parsed)
    parsed_topics = dict(parsed)
    return [
        NamespaceSpec(
            name=name,
            port=ports[i] if ports else 0,
            queues=tuple(queues),
            session_queues=tuple(session_queues),
            topics=parsed_topics,
            hybrid_connections=tuple(hybrid_connections),
        )
        for i, name in enumerate(namespaces)
    ]


def _check_names(
    queues: Sequence[str],
    session_queues: Sequence[str],
    topics: Sequence[tuple[str, tuple[str, ...]]],
) -> None:
    """Refuse, in one line, names that would clash: a namespace holds one queue or topic
    per name, and a topic one subscription per name.

    Raises:
        ValueError: Two entities share a name, or a topic names a subscription twice.
    """
    kinds: dict[str, str] = {}
    named = [
        *(("queue", name) for name in queues),
        *(("session queue", name) for name in session_queues),
        *(("topic", name) for name, _ in topics),
    ]
    for kind, name in named:
        earlier = kinds.get(name)
        if earlier == kind:
            raise ValueError(f"the {kind} '{name}' is given twice: give it once")
        if earlier is not None:
            raise ValueError(
                f"the {kind} '{name}' clashes with the {earlier} '{name}': queues and topics "
                "share one set of names in a namespace; rename one"
            )
        kinds[name] = kind
    for name, subscriptions in topics:
        twice = sorted({s for s in subscriptions if subscriptions.count(s) > 1})
        if twice:
            raise ValueError(
                f"topic '{name}' names the subscription '{twice[0]}' twice: give it once"
            )


def environment_lines(description: dict[str, Any]) -> list[str]:
    """``export NAME=value`` lines for a shell (values quoted): each namespace's
    connection string as ``GEOREP_<NAME>`` (``GEOREP_PRIMARY``, ``GEOREP_SECONDARY``: what
    ``georep doctor``, ``demo`` and ``syphon`` read), then ``GEOREP_CA_FILE``,
    ``GEOREP_EMULATOR_CONTROL_URL`` and, last, ``GEOREP_EMULATOR_CONTROL_TOKEN`` (what
    ``georep fault`` reads)."""
    pairs: list[tuple[str, str]] = [
        (_variable(name), info["connection_string"])
        for name, info in description["namespaces"].items()
    ]
    if description.get("ca_file"):
        pairs.append(("GEOREP_CA_FILE", description["ca_file"]))
    pairs.append(("GEOREP_EMULATOR_CONTROL_URL", description["control_url"]))
    pairs.append((CONTROL_TOKEN_ENV, description["control_token"]))
    return [f"export {name}={shlex.quote(str(value))}" for name, value in pairs]


def _variable(namespace: str) -> str:
    return "GEOREP_" + re.sub(r"[^A-Z0-9]", "_", namespace.upper())


def _print_text(description: dict[str, Any]) -> None:
    print(
        f"georep emulator ready (control: {description['control_url']}, "
        f"control token: {description['control_token']}, "
        f"CA file: {description['ca_file']})"
    )
    for name, info in description["namespaces"].items():
        print(f"  {name}: {info['connection_string']}")
        relay = info.get("relay") or {}
        if relay.get("hybrid_connections"):
            paths = ", ".join(relay["hybrid_connections"])
            print(f"    relay: wss://127.0.0.1:{relay['port']} (hybrid connections: {paths})")
    print(
        f"For georep fault: export {CONTROL_TOKEN_ENV}={description['control_token']}. "
        "Ctrl-C to stop.",
        flush=True,
    )


def _print_lines(lines: Iterable[str]) -> None:
    for line in lines:
        print(line)
    sys.stdout.flush()


class EmulatorServer:
    """Every namespace of one emulator, plus the control endpoint, on one event loop."""

    def __init__(
        self,
        specs: Iterable[NamespaceSpec],
        *,
        control_port: int = 0,
        state_dir: Path | None = None,
        control_token: str | None = None,
    ) -> None:
        self._specs = list(specs)
        # What a control client must present (see _control): random unless given.
        self.control_token = control_token or secrets.token_urlsafe(24)
        names = [s.name for s in self._specs]
        if len(set(names)) != len(names):
            raise ValueError(f"namespace names must be unique, got {names}")
        self.control_port = control_port
        self._own_dir = state_dir is None
        self.state_dir = Path(state_dir or tempfile.mkdtemp(prefix="georep-emulator-"))
        self.namespaces: dict[str, NamespaceServer] = {}
        self._control_runner: web.AppRunner | None = None
        self._admin_runners: list[web.AppRunner] = []
        self.ca_file: Path | None = None
        self.entra_key_file: Path | None = None

    @property
    def control_url(self) -> str:
        return f"http://127.0.0.1:{self.control_port}"

    async def start(self) -> None:
        cert, key = make_self_signed_certificate(self.state_dir)
        self.ca_file = cert
        self.entra_key_file = make_signing_key(self.state_dir)
        entra_public_key = load_signing_key(self.entra_key_file).public_key()
        ssl_context = server_ssl_context(cert, key)
        for spec in self._specs:
            server = NamespaceServer(spec, ssl_context=ssl_context, admin_handler=None)
            server.entra_public_key = entra_public_key
            runner = web.AppRunner(build_admin_app(NamespaceAdminBackend(server)), access_log=None)
            await runner.setup()
            self._admin_runners.append(runner)
            server.admin_handler = runner.server
            await server.start()
            server.relay = RelayServer(
                server,
                ssl_context=ssl_context,
                hybrid_connections=spec.hybrid_connections,
                port=spec.relay_port,
            )
            await server.relay.start()
            self.namespaces[spec.name] = server
        await self._start_control()

    async def _start_control(self) -> None:
        runner = web.AppRunner(build_control_app(self), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", self.control_port, reuse_address=True)
        await site.start()
        # aiohttp types _server as AbstractServer, which lacks .sockets (it is an asyncio.Server).
        sockets = site._server.sockets if site._server is not None else []  # type: ignore[attr-defined]
        self.control_port = sockets[0].getsockname()[1]
        self._control_runner = runner

    def describe(self) -> dict[str, Any]:
        return {
            "control_url": self.control_url,
            "control_token": self.control_token,
            "ca_file": str(self.ca_file) if self.ca_file else None,
            "entra_key_file": str(self.entra_key_file) if self.entra_key_file else None,
            "pid": os.getpid(),
            "namespaces": {
                name: {
                    "port": ns.port,
                    "connection_string": ns.connection_string(),
                    "key_name": ns.key_name,
                    "rules": {
                        name: {
                            "rights": sorted(rule.rights),
                            "connection_string": ns.connection_string_for(name),
                        }
                        for name, rule in ns.rules.items()
                    },
                    "relay": ns.relay.describe() if ns.relay is not None else None,
                }
                for name, ns in self.namespaces.items()
            },
        }

    async def close(self) -> None:
        for server in self.namespaces.values():
            await server.close()
        for runner in self._admin_runners:
            await runner.cleanup()
        if self._control_runner is not None:
            await self._control_runner.cleanup()
        if self._own_dir:
            for path in self.state_dir.glob("*"):
                path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self.state_dir.rmdir()


async def serve(
    specs: Sequence[NamespaceSpec],
    *,
    control_port: int,
    on_ready: Callable[[dict[str, Any]], None],
    stop_on_stdin_eof: bool = False,
    control_token: str | None = None,
) -> None:
    """Start the emulator, call ``on_ready`` with its description, run until stopped.

    Stops on SIGINT/SIGTERM, or when standard input closes if ``stop_on_stdin_eof``
    (how a parent process that dies takes its emulator with it).
    """
    server = EmulatorServer(specs, control_port=control_port, control_token=control_token)
    await server.start()
    stop = asyncio.Event()
    watcher: asyncio.Task[None] | None = None
    if stop_on_stdin_eof:
        watcher = asyncio.create_task(_wait_for_stdin_eof(stop))
    try:
        with stop_on_signals(stop):
            on_ready(server.describe())
            await stop.wait()
    finally:
        if watcher is not None:
            watcher.cancel()
        await server.close()


async def _wait_for_stdin_eof(stop: asyncio.Event) -> None:
    await asyncio.to_thread(sys.stdin.buffer.read)
    stop.set()


def _argument_parser() -> argparse.ArgumentParser:
    """The command line; each option's ``dest`` is the name of :func:`run`'s parameter."""
    parser = argparse.ArgumentParser(
        prog="python -m georep.adapters.emulator",
        description=(
            "A local two-region Azure Service Bus emulator (AMQP 1.0, real SAS, fault injection)."
        ),
    )
    parser.add_argument(
        "--namespace",
        action="append",
        dest="namespaces",
        help="namespace name (repeat); default primary, secondary",
    )
    parser.add_argument(
        "--port",
        action="append",
        type=int,
        dest="ports",
        help="port per namespace, in order (0 = any free)",
    )
    parser.add_argument(
        "--queue",
        action="append",
        dest="queues",
        default=[],
        help="queue to create in every namespace (repeat)",
    )
    parser.add_argument(
        "--session-queue",
        action="append",
        dest="session_queues",
        default=[],
        help="session-enabled queue (requires_session) to create in every namespace (repeat)",
    )
    parser.add_argument(
        "--topic",
        action="append",
        dest="topics",
        default=[],
        help="topic NAME[:SUB1,SUB2] to create in every namespace",
    )
    parser.add_argument(
        "--hybrid-connection",
        action="append",
        dest="hybrid_connections",
        default=[],
        help="relay hybrid connection to create in every namespace (repeat)",
    )
    parser.add_argument(
        "--control-port",
        type=int,
        default=DEFAULT_CONTROL_PORT,
        help="HTTP control port (0 = any free)",
    )
    parser.add_argument(
        "--control-token",
        default=os.environ.get(CONTROL_TOKEN_ENV) or None,
        help=f"the control endpoint's token (default ${CONTROL_TOKEN_ENV}, else random)",
    )
    parser.add_argument(
        "--print",
        choices=PRINT_FORMATS,
        default="text",
        dest="print_as",
        help="what to print once ready: text, one JSON line describing the emulator, or "
        "env (export lines for a shell)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        dest="as_json",
        help="the same as --print json",
    )
    parser.add_argument(
        "--stop-on-stdin-eof", action="store_true", help="exit when standard input closes"
    )
    parser.add_argument("--log-level", default="WARNING")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m georep.adapters.emulator``: parse ``argv``, then :func:`run`."""
    return run(**vars(_argument_parser().parse_args(argv)))


def run(
    *,
    namespaces: Sequence[str] | None = None,
    ports: Sequence[int] | None = None,
    queues: Sequence[str] = (),
    session_queues: Sequence[str] = (),
    topics: Sequence[str] = (),
    hybrid_connections: Sequence[str] = (),
    control_port: int = DEFAULT_CONTROL_PORT,
    control_token: str | None = None,
    as_json: bool = False,
    print_as: str = "text",
    stop_on_stdin_eof: bool = False,
    log_level: str = "WARNING",
) -> int:
    """Run the emulator in the foreground until stopped; the exit status.

    Shared by both command lines (``georep emulator`` and ``python -m
    georep.adapters.emulator``), each of which parses its own options.

    Args:
        namespaces: Namespace names (default ``primary`` and ``secondary``).
        ports: One port per namespace, in order (0 = any free; default: the usual ports
            for the default pair, any free otherwise).
        queues: Queues created in every namespace.
        session_queues: Session-enabled queues created in every namespace.
        topics: Topics ``NAME[:SUB1,SUB2]`` created in every namespace.
        hybrid_connections: Relay hybrid connections created in every namespace.
        control_port: The HTTP control endpoint's port (0 = any free).
        control_token: The control endpoint's token (default: random).
        as_json: The same as ``print_as="json"``.
        print_as: What to print once ready: ``"text"`` for people, ``"json"`` (one line:
            the emulator's description) or ``"env"`` (:func:`environment_lines`).
        stop_on_stdin_eof: Exit when standard input closes.
        log_level: The logging level name.
    """
    logging.basicConfig(
        level=log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    namespaces = list(namespaces or ["primary", "secondary"])
    ports = list(ports or ([*DEFAULT_PORTS] if namespaces == ["primary", "secondary"] else []))
    try:
        specs = build_specs(namespaces, ports, queues, topics, hybrid_connections, session_queues)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    if as_json:
        print_as = "json"
    if print_as not in PRINT_FORMATS:
        print(f"error: print {print_as!r}: use one of {', '.join(PRINT_FORMATS)}", file=sys.stderr)
        return 2

    def on_ready(description: dict[str, Any]) -> None:
        if print_as == "json":
            _print_lines([json.dumps(description)])
        elif print_as == "env":
            _print_lines(environment_lines(description))
        else:
            _print_text(description)

    with contextlib.suppress(KeyboardInterrupt):
        try:
            asyncio.run(
                serve(
                    specs,
                    control_port=control_port,
                    on_ready=on_ready,
                    stop_on_stdin_eof=stop_on_stdin_eof,
                    control_token=control_token,
                )
            )
        except OSError as exc:
            print(
                f"error: cannot start the emulator: {exc}. "
                "Pick free ports with --port/--control-port (0 = any).",
                file=sys.stderr,
            )
            return 1
        except BrokerError as exc:  # an entity the broker refuses: one line, no traceback
            print(f"error: cannot create the entities: {exc.description}", file=sys.stderr)
            return 2
    return 0
