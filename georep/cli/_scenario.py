"""A replication scenario end to end: the engine behind ``georep demo`` and ``georep bench``.

A sender sends at a steady rate (or as fast as it can) through georep in one mode, receivers
on both regions deduplicate through a Redis seen-set, the primary region has an outage in the
middle and recovers, and everything is written to a delivery ledger for the Spark audit.

Against the bundled emulator by default; against real Azure namespaces when connection
strings are given (no fault can be injected there, so the outage is skipped).
"""

from __future__ import annotations

__all__ = ["ScenarioConfig", "ScenarioResult", "run_scenario"]

import asyncio
import logging
import math
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from georep._lifecycle import finish_task
from georep.exceptions import ConfigurationError, GeoReplicationError
from georep.ports import RegionAttempt, SendRecord

_log = logging.getLogger("georep.scenario")

MODES = ("passive", "active", "paired", "raw")
#: Lock duration of the emulated queue, seconds.
DEMO_LOCK_SECONDS = 5


@dataclass(frozen=True, kw_only=True)
class ScenarioConfig:
    """What to run.

    Attributes:
        work_dir: Where the ledger, outbox and report go.
        mode: ``passive`` (default), ``active``, ``paired``, or ``raw`` (the plain SDK
            sender on the primary, for comparison: no failover, no outbox).
        messages: Logical messages to send. Default 3,000.
        rate: Messages per second; 0 sends as fast as one sender can. Default 100.
        outage_at: Seconds after the first send when the primary's outage starts; None for
            no outage. Default 10.
        outage_for: Seconds the outage lasts. Default 8.
        receivers: GeoReceivers sharing the seen-set. Default 2.
        queue: The queue, created in both emulated namespaces. Default ``orders``.
        primary: Primary connection string; None starts the emulator.
        secondary: Secondary connection string.
        redis_url: The seen-set's Redis; None uses ``$REDIS_URL`` or an embedded server.
        settle_timeout: Seconds without a message processed, after the last send, before
            the receivers are taken to be stuck (with sessions at least 90: order waits
            take up to 60 s); the wait ends at ten times it in any case.
        sessions: 0 (default): plain messages. N: the messages go round-robin over N
            sessions of a session-enabled queue, read by GeoReceivers in session mode
            (docs/sessions.md); passive and active modes only.
        pipeline: Read with a Structured Streaming query (the georep source, in a driver
            process killed once partway) into a Parquet table instead of GeoReceivers
            (``_pipeline.py``); passive and active modes, no sessions.
    """

    work_dir: Path
    mode: str = "passive"
    messages: int = 3_000
    rate: float = 100.0
    outage_at: float | None = 10.0
    outage_for: float = 8.0
    receivers: int = 2
    queue: str = "orders"
    primary: str | None = None
    secondary: str | None = None
    redis_url: str | None = None
    settle_timeout: float = 30.0
    sessions: int = 0
    pipeline: bool = False

    def __post_init__(self) -> None:
        if self.pipeline and (self.sessions or self.mode not in ("passive", "active")):
            raise ConfigurationError(
                "--pipeline needs mode passive or active and no --sessions (the georep "
                f"Spark source reads neither paired backlogs nor sessions), not {self.mode!r}"
                + (" with sessions" if self.sessions else "")
            )
        if self.sessions < 0:
            raise ConfigurationError("sessions must be 0 (none) or more")
        if self.sessions and self.mode not in ("passive", "active"):
            raise ConfigurationError(
                f"sessions need mode passive or active (session order is restored by "
                f"GeoSender and GeoReceiver), not {self.mode!r}"
            )
        if self.mode not in MODES:
            raise ConfigurationError(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.messages < 1 or self.receivers < 1:
            raise ConfigurationError("messages and receivers must be at least 1")
        if self.rate < 0 or self.outage_for <= 0:
            raise ConfigurationError("rate must be 0 or more and outage_for more than 0")
        for option, value in (
            ("--rate", self.rate),
            ("--outage-at", self.outage_at),
            ("--outage-for", self.outage_for),
        ):
            if value is not None and not (math.isfinite(value) and value >= 0):
                # inf: an outage that never comes (or never ends), and a demo that never ends
                raise ConfigurationError(f"{option} must be a finite number, 0 or more")
        if (self.primary is None) != (self.secondary is None):
            raise ConfigurationError("give both --primary and --secondary, or neither")


@dataclass
class ScenarioProgress:
    """Live counters, read by the progress display while the scenario runs."""

    phase: str = "starting"
    started: float = 0.0
    sent: int = 0
    accepted: Counter[str] = field(default_factory=Counter)
    queued: int = 0
    send_errors: int = 0
    failovers: int = 0
    processed_ids: Counter[str] = field(default_factory=Counter)
    receivers: list[Any] = field(default_factory=list)
    out_of_session_order: int = 0
    """Session mode: messages handled after a later message of their session."""
    highest_handled: dict[str, int] = field(default_factory=dict)
    """Session mode: per session, the highest message index handled so far."""

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started if self.started else 0.0

    @property
    def processed(self) -> int:
        """Logical messages processed at least once."""
        return len(self.processed_ids)

    @property
    def received(self) -> Counter[str]:
        """Copies received, by region, over all receivers."""
        return self._over_receivers("received")

    @property
    def suppressed(self) -> Counter[str]:
        """Duplicate copies settled without the handler, by region."""
        return self._over_receivers("suppressed")

    def _over_receivers(self, counter: str) -> Counter[str]:
        total: Counter[str] = Counter()
        for receiver in self.receivers:
            total.update(getattr(receiver.stats, counter))
        return total


@dataclass
class ScenarioResult:
    """What the scenario measured itself (the audit reads the ledger independently)."""

    config: ScenarioConfig
    ledger_dir: Path
    acknowledged: set[str]
    processed: Counter[str]
    outage_windows: list[tuple[datetime, datetime]]
    failover_seconds: float | None
    send_seconds: float
    progress: ScenarioProgress

    @property
    def lost(self) -> int:
        return len(self.acknowledged - set(self.processed))

    @property
    def processed_more_than_once(self) -> int:
        return sum(1 for count in self.processed.values() if count > 1)

    @property
    def send_rate(self) -> float:
        return len(self.acknowledged) / self.send_seconds if self.send_seconds else 0.0


class _Topology:
    """The two namespaces: the emulator's, or real ones from connection strings."""

    def __init__(self, config: ScenarioConfig) -> None:
        self.config = config
        self.emulator: Any = None
        self.primary = config.primary or ""
        self.secondary = config.secondary or ""

    @property
    def can_inject_faults(self) -> bool:
        return self.emulator is not None

    async def start(self) -> None:
        if self.config.primary is not None:
            return
        from georep.adapters.emulator import Emulator

        self.emulator = Emulator(namespaces=("primary", "secondary"))
        await asyncio.to_thread(self.emulator.start)
        for namespace in self.emulator.namespaces:
            # A copy in flight when a connection dies stays locked until its lock expires
            # (as in Service Bus), then comes back: keep that wait short for a demo.
            await asyncio.to_thread(
                self.emulator.namespace(namespace).create_queue,
                self.config.queue,
                lock_duration=DEMO_LOCK_SECONDS,
                requires_session=self.config.sessions > 0,
            )
        self.primary = self.emulator.connection_string("primary")
        self.secondary = self.emulator.connection_string("secondary")

    async def outage(self) -> None:
        await asyncio.to_thread(self.emulator.namespace("primary").outage)

    async def restore(self) -> None:
        await asyncio.to_thread(self.emulator.namespace("primary").restore)

    async def empty(self, entities: dict[str, list[str]]) -> bool:
        """Every listed entity (by namespace) is empty; always True for real namespaces,
        which the scenario does not inspect."""
        if self.emulator is None:
            return True
        for namespace, names in entities.items():
            control = self.emulator.namespace(namespace)
            for name in names:
                if await asyncio.to_thread(control.message_count, name):
                    return False
        return True

    def primary_namespace(self) -> str:
        from georep.adapters.servicebus._sender import namespace_of

        return namespace_of(self.primary)

    async def admin_secondary(self) -> Any:
        if self.emulator is not None:
            return self.emulator.async_admin_client("secondary")
        from azure.servicebus.aio.management import ServiceBusAdministrationClient

        return ServiceBusAdministrationClient.from_connection_string(self.secondary)

    async def stop(self) -> None:
        if self.emulator is not None:
            await asyncio.to_thread(self.emulator.stop)


class _Sender:
    """One interface over GeoSender, PairedSender (+ syphon) and the raw SDK sender."""

    def __init__(self, config: ScenarioConfig, topology: _Topology, ledger: Any) -> None:
        self.config = config
        self.topology = topology
        self.ledger = ledger
        self._impl: Any = None
        self._syphon: Any = None
        self._syphon_task: asyncio.Task[None] | None = None
        self._client: Any = None
        self._options: Any = None
        self._outbox: Any = None
        self._last_region = "primary"

    async def open(self) -> None:
        from georep import FailoverPolicy, GeoSender, ReplicationMode, SqliteOutbox

        config, topology = self.config, self.topology
        if config.mode == "raw":
            from azure.servicebus.aio import ServiceBusClient

            self._client = ServiceBusClient.from_connection_string(topology.primary)
            self._impl = self._client.get_queue_sender(config.queue)
            return
        if config.mode == "paired":
            await self._open_paired()
            return
        self._outbox = SqliteOutbox(config.work_dir / "outbox.sqlite")
        self._impl = GeoSender.from_connection_strings(
            topology.primary,
            topology.secondary,
            queue_name=config.queue,
            mode=ReplicationMode(config.mode),
            # With sessions each region holds dozens of session links: when the primary
            # drops them all, the secondary (the same emulator process) can take more
            # than 2 s to answer on a loaded machine, and sends were queued instead of
            # failing over.
            policy=FailoverPolicy(attempt_timeout=5.0 if config.sessions else 2.0),
            outbox=self._outbox,
            ledger=self.ledger,
        )
        await self._impl.__aenter__()

    async def _open_paired(self) -> None:
        from georep import PairedNamespaceOptions, PairedSender, Syphon
        from georep.adapters.servicebus import ensure_backlog_queues

        self._options = options = PairedNamespaceOptions(
            backlog_queue_count=4,
            failover_interval=0,
            ping_primary_interval=1,
            ping_timeout=5,
            syphon_long_poll=1,
        )
        name = self.topology.primary_namespace()
        async with await self.topology.admin_secondary() as admin:
            await ensure_backlog_queues(admin, name, options)
        self._impl = PairedSender.from_connection_strings(
            self.topology.primary,
            self.topology.secondary,
            queue_name=self.config.queue,
            primary_namespace=name,
            options=options,
            ledger=self.ledger,
        )
        await self._impl.__aenter__()
        self._syphon = Syphon.from_connection_strings(
            self.topology.primary, self.topology.secondary, primary_namespace=name, options=options
        )
        self._syphon_task = asyncio.create_task(self._syphon.run())

    async def send(self, message: Any) -> tuple[str | None, bool, bool]:
        """Send one message; return (region that took it, failed over, queued)."""
        if self.config.mode == "raw":
            # The plain SDK sender knows no ledger: record its sends the same way.
            started = time.time()
            try:
                await self._impl.send_messages(message)
            except Exception as exc:
                self._record_raw(
                    message, started, RegionAttempt("primary", "failed", type(exc).__name__)
                )
                raise
            self._record_raw(message, started, RegionAttempt("primary", "accepted"))
            return "primary", False, False
        if self.config.mode == "paired":
            place = await self._impl.send_messages(message)
            region = "primary" if place == "primary" else "secondary"
            switched, self._last_region = region != self._last_region, region
            return region, switched and region == "secondary", False
        result = await self._impl.send_messages(message)
        accepted: str | None = result.accepted[0] if result.accepted else None
        return accepted, result.failed_over, result.queued

    def _record_raw(self, message: Any, started: float, attempt: RegionAttempt) -> None:
        accepted = attempt.outcome == "accepted"
        self.ledger.record_send(
            SendRecord(
                message_ids=(str(message.message_id),),
                entity=self.config.queue,
                mode="raw",
                outcome="accepted" if accepted else "failed",
                accepted_region="primary" if accepted else None,
                failover=False,
                regions=(attempt,),
                started_at=started,
                finished_at=time.time(),
            )
        )

    async def flush(self, deadline: float) -> None:
        """Deliver whatever the outbox holds, until it is empty or the deadline passes."""
        if self._outbox is not None:
            while time.monotonic() < deadline:
                depth = await self._outbox.depth()
                if not depth:
                    return
                await self._impl.drain_outbox()
                await asyncio.sleep(0.2)

    def backlog_paths(self) -> list[str]:
        """The backlog queues the syphon still has to empty (none outside paired mode)."""
        if self._options is None:
            return []
        from georep import backlog_queue_path

        name = self.topology.primary_namespace()
        return [backlog_queue_path(name, i) for i in range(self._options.backlog_queue_count)]

    async def close(self) -> None:
        if self._syphon is not None:
            await self._syphon.aclose()
            await finish_task(self._syphon_task, timeout=10)
        if self._impl is not None:
            if self.config.mode == "raw":
                await self._impl.close()
                await self._client.close()
            else:
                await self._impl.aclose()
        if self._outbox is not None:  # None when opening failed before it was made
            await self._outbox.aclose()


async def run_scenario(
    config: ScenarioConfig,
    *,
    progress: ScenarioProgress | None = None,
) -> ScenarioResult:
    """Run the scenario; the ledger is flushed and closed when it returns.

    ``progress`` is updated as the scenario runs (a live display reads it).

    Raises:
        ConfigurationError: The configuration cannot run (e.g. a malformed connection string).
    """
    from georep import ParquetLedger

    config.work_dir.mkdir(parents=True, exist_ok=True)
    ledger_dir = config.work_dir / "ledger"
    topology = _Topology(config)
    await topology.start()
    progress = progress if progress is not None else ScenarioProgress()
    run = _Run(config, progress, topology, ParquetLedger(ledger_dir))
    try:
        await run.start_receivers()
        await run.sender.open()
        send_seconds = await run.send_all()
        await run.settle()
    finally:
        await run.close()
    return ScenarioResult(
        config=config,
        ledger_dir=ledger_dir,
        acknowledged=run.acknowledged,
        processed=run.progress.processed_ids,
        outage_windows=run.windows,
        failover_seconds=run.failover_seconds,
        send_seconds=send_seconds,
        progress=run.progress,
    )


@dataclass
class _Run:
    """One scenario run's parts and measurements, in the order :func:`run_scenario` uses them."""

    config: ScenarioConfig
    progress: ScenarioProgress
    topology: _Topology
    ledger: Any
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    receivers: list[Any] = field(default_factory=list)
    receiver_tasks: list[asyncio.Task[None]] = field(default_factory=list)
    acknowledged: set[str] = field(default_factory=set)
    windows: list[tuple[datetime, datetime]] = field(default_factory=list)
    failover_seconds: float | None = None
    outage_started: float | None = None

    def __post_init__(self) -> None:
        self.sender = _Sender(self.config, self.topology, self.ledger)

    async def start_receivers(self) -> None:
        """Start ``config.receivers`` GeoReceivers sharing one Redis seen-set."""
        from georep import GeoReceiver
        from georep.adapters.redis import RedisSeenSet, embedded_redis_url

        config, topology = self.config, self.topology
        redis_url: str = (
            config.redis_url
            if config.redis_url is not None
            else await asyncio.to_thread(embedded_redis_url)
        )
        processed = self.progress.processed_ids

        progress = self.progress

        async def handle(message: Any) -> None:
            processed[str(message.message_id)] += 1
            if message.session_id is not None:  # "order <index>", indexes grow per session
                index = int(str(message).split()[-1])
                highest = progress.highest_handled.get(message.session_id, -1)
                if index < highest:
                    progress.out_of_session_order += 1
                progress.highest_handled[message.session_id] = max(highest, index)

        session_options: dict[str, Any] = (
            {"sessions": True, "max_sessions": 16, "order_wait": 60.0} if config.sessions else {}
        )
        for _ in range(config.receivers):
            receiver = GeoReceiver.from_connection_strings(
                topology.primary,
                topology.secondary,
                queue_name=config.queue,
                seen=RedisSeenSet(redis_url, group=f"demo-{self.run_id}"),
                concurrency=16,
                max_wait=0.5,
                ledger=self.ledger,
                **session_options,
            )
            self.receivers.append(receiver)
            self.progress.receivers.append(receiver)
            self.receiver_tasks.append(asyncio.create_task(receiver.run(handle)))

    async def _outage(self) -> None:
        """Take the primary down at ``outage_at`` for ``outage_for`` seconds."""
        config, progress = self.config, self.progress
        assert config.outage_at is not None
        await asyncio.sleep(config.outage_at)
        began = datetime.now(UTC)
        await self.topology.outage()
        self.outage_started = time.monotonic()
        progress.phase = "OUTAGE (primary)"
        await asyncio.sleep(config.outage_for)
        await self.topology.restore()
        self.windows.append((began, datetime.now(UTC)))
        progress.phase = "recovered"

    async def send_all(self) -> float:
        """Send every message at the configured rate (the outage meanwhile); return seconds."""
        config, progress = self.config, self.progress
        progress.phase = "sending"
        progress.started = time.monotonic()
        outage_task: asyncio.Task[None] | None = None
        if config.outage_at is not None and self.topology.can_inject_faults:
            outage_task = asyncio.create_task(self._outage())
        elif config.outage_at is not None:
            progress.phase = "sending (no outage: real namespaces)"
        for index in range(config.messages):
            if config.rate:
                due = progress.started + index / config.rate
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            await self._send_one(index)
        send_seconds = time.monotonic() - progress.started
        if outage_task is not None:
            progress.phase = "waiting for the primary to recover"
            await outage_task
        return send_seconds

    async def _send_one(self, index: int) -> None:
        """Send message ``index`` until acknowledged (50 tries at most), and count it."""
        from azure.servicebus import ServiceBusMessage

        progress = self.progress
        message_id = f"{self.run_id}-{index:07d}"
        for attempt in range(50):
            session = f"session-{index % self.config.sessions}" if self.config.sessions else None
            message = ServiceBusMessage(f"order {index}", message_id=message_id, session_id=session)
            try:
                region, failed_over, queued = await self.sender.send(message)
            except GeoReplicationError as exc:
                # Not acknowledged: the application retries the same message (same
                # MessageId, so a copy that did land is suppressed downstream).
                progress.send_errors += 1
                _log.info("send %s failed (attempt %d): %s", message_id, attempt + 1, exc)
                await asyncio.sleep(0.2)
                continue
            break
        else:
            return
        self.acknowledged.add(message_id)
        progress.sent += 1
        if queued:
            progress.queued += 1
        elif region is not None:
            progress.accepted[region] += 1
        if failed_over:
            progress.failovers += 1
        if (
            self.failover_seconds is None
            and self.outage_started is not None
            and region not in (None, "primary")
        ):
            self.failover_seconds = time.monotonic() - self.outage_started

    async def settle(self) -> None:
        """Wait until every acknowledged message was processed, for as long as the
        receivers make progress: ``settle_timeout`` seconds without a message processed
        ends the wait (a slow machine is slower, not stuck), and so does ten times it."""
        config, progress = self.config, self.progress
        progress.phase = "settling"
        # With sessions a message may wait for order up to the receivers' order_wait (60 s)
        # after the outage: a quiet spell that long plus a lock's expiry is not stuck.
        stall = max(config.settle_timeout, 90.0) if config.sessions else config.settle_timeout
        started = time.monotonic()
        # Settled means: every twin suppressed and the syphon's backlog moved home.
        queues = {
            "primary": [config.queue],
            "secondary": [config.queue, *self.sender.backlog_paths()],
        }
        await self.sender.flush(started + stall)
        processed, moved = len(progress.processed_ids), time.monotonic()
        while (now := time.monotonic()) - moved < stall and now - started < 10 * stall:
            if self.acknowledged <= set(progress.processed_ids) and await self.topology.empty(
                queues
            ):
                break
            if len(progress.processed_ids) != processed:
                processed, moved = len(progress.processed_ids), now
            await asyncio.sleep(0.2)
        progress.phase = "done"

    async def close(self) -> None:
        """Close the sender, the receivers, the ledger and the topology, in that order."""
        await self.sender.close()
        for receiver in self.receivers:
            await receiver.aclose()
        for task in self.receiver_tasks:
            await finish_task(task, timeout=15)
        await self.ledger.aclose()
        await self.topology.stop()
