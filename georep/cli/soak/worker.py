"""One process of a soak: a sender, a receiver or the syphon (``python -m georep.cli.soak.worker``).

The soak's runner starts each with a JSON spec (:class:`WorkerSpec`) and may SIGKILL it at
any moment (then starts it again, with the next incarnation). What a worker leaves behind:

- its rows in the delivery ledger (``ledger/``, flushed every 5 s);
- its history (``history/<name>.<incarnation>.jsonl``): one line per message acknowledged
  to it (``ack``) or handled by its handler (``handled``), written straight to the file
  descriptor, so a SIGKILL loses no line the handler finished;
- its status (``status/<name>.json``, rewritten every half second): what it did so far,
  its sender's active region. A status that stops changing while the
  process lives means a hung process: the runner sends SIGUSR1 and faulthandler writes
  every thread's stack to ``stacks/<name>.<incarnation>.txt``.

It stops sending when the runner writes ``quiet`` to ``phase``, and exits on SIGTERM.
"""

from __future__ import annotations

__all__ = ["WorkerSpec", "main"]

import asyncio
import contextlib
import faulthandler
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from georep._lifecycle import wait_within

_log = logging.getLogger("georep.soak.worker")

#: The syphon's and the paired sender's options (the runner creates the backlog queues).
PAIRED_OPTIONS: dict[str, Any] = {
    "backlog_queue_count": 2,
    "failover_interval": 0,
    "ping_primary_interval": 1,
    "ping_timeout": 5,
    "syphon_long_poll": 1,
}
#: The application name the soak's senders share roles under (``georep failover --app``).
APP = "soak"


#: Seconds after SIGTERM at which a worker that has not exited writes its threads' and
#: tasks' stacks (well before the runner gives up on it).
EXIT_WATCH_SECONDS = 20.0


@dataclass
class WorkerSpec:
    """What one worker process does.

    Attributes:
        name: Unique in the run (``sender-passive-async``, ``receiver-queue-1``...).
        role: ``sender``, ``receiver`` or ``syphon``.
        entity: The queue or topic sent to; the queue or ``topic/Subscriptions/sub``
            received from.
        run_dir: The run's directory.
        primary, secondary: The regions' connection strings.
        redis_url: The soak's Redis (the role store; the seen-set too, unless ``seen_url``).
        seen_url: The receivers' seen-set Redis (a node of it, with ``seen_cluster``).
        seen_cluster: ``seen_url`` is a node of a Redis Cluster.
        primary_namespace: The primary's namespace name (paired mode's backlog paths).
        topic: A sender's ``entity`` is a topic.
        mode: A sender's ``passive``, ``active`` or ``paired``.
        sync: Use :mod:`georep.sync` (a blocking sender, a sync handler).
        sessions: A sender: the sessions it writes (it is their one writer), round robin.
        receive_sessions: A receiver: read in session mode.
        partitioned: A sender: the entity is partitioned in both regions.
        spark: A sender: the georep Spark sink of a streaming query (passive mode).
        rate: A sender's messages per second.
        incarnation: How many times this worker was started before.
    """

    name: str
    role: str
    entity: str
    run_dir: str
    primary: str
    secondary: str
    redis_url: str
    seen_url: str = ""
    seen_cluster: bool = False
    primary_namespace: str = ""
    topic: bool = False
    mode: str = "passive"
    sync: bool = False
    sessions: list[str] = field(default_factory=list)
    receive_sessions: bool = False
    partitioned: bool = False
    spark: bool = False
    rate: float = 5.0
    incarnation: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self))


class _Worker:
    """What every worker shares: its files, its stop flag, its status."""

    def __init__(self, spec: WorkerSpec, exit_watch: float = EXIT_WATCH_SECONDS) -> None:
        self.spec = spec
        self._exit_watch = exit_watch
        self.run_dir = Path(spec.run_dir)
        tag = f"{spec.name}.{spec.incarnation}"
        self.stop = threading.Event()
        #: The event loops the worker's code runs on (the exit watch lists their tasks).
        self.loops: list[asyncio.AbstractEventLoop] = []
        self.status: dict[str, Any] = {"name": spec.name, "pid": os.getpid(), "errors": 0}
        self._history = os.open(
            self.run_dir / "history" / f"{tag}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
        )
        # Never closed: a dump may be asked for while the interpreter shuts down.
        _STACK_FILES.append((self.run_dir / "stacks" / f"{tag}.txt").open("w"))
        faulthandler.register(signal.SIGUSR1, file=_STACK_FILES[-1], all_threads=True)
        # A signal handler runs in the main thread between two of its bytecodes, maybe while
        # that thread holds the lock inside ``self.stop`` (in Event.set or Event.wait, or in a
        # first handler interrupted by a second signal): a handler taking that lock waits for
        # itself forever. So the handler only writes a byte, and a thread does the stopping.
        self._signals, wake = os.pipe()
        os.set_blocking(wake, False)
        self._wake = wake
        threading.Thread(target=self._await_signal, name="soak-signals", daemon=True).start()
        signal.signal(signal.SIGTERM, self._signalled)
        signal.signal(signal.SIGINT, self._signalled)

    def _signalled(self, *_: object) -> None:
        with contextlib.suppress(BlockingIOError):  # full: a byte is already waiting
            os.write(self._wake, b"\0")

    def _await_signal(self) -> None:
        os.read(self._signals, 1)
        self._stopping()

    def _stopping(self) -> None:
        if "stopping" not in self.status:
            self.status["stopping"] = time.time()
            threading.Thread(
                target=self._watch_exit,
                args=(self._exit_watch,),
                name="soak-exit-watch",
                daemon=True,
            ).start()
        self.stop.set()

    def _watch_exit(self, after: float) -> None:
        """Still here ``after`` seconds after SIGTERM: write what every thread and every
        asyncio task is doing (a thread's stack alone shows an event loop in ``select``,
        not the task that keeps it from ending)."""
        time.sleep(after)
        out = _STACK_FILES[-1]
        out.write(f"--- still running {after:g} s after SIGTERM\n")
        from georep._sync_runtime import RUNTIME

        sync_loop = RUNTIME._loop  # georep.sync's loop thread, in a sync worker
        for loop in [*self.loops, *([sync_loop] if sync_loop is not None else [])]:
            tasks = list(asyncio.all_tasks(loop))  # it retries a set changed mid-read
            out.write(f"--- {len(tasks)} asyncio task(s) left on {loop!r}\n")
            for task in tasks:
                with contextlib.suppress(Exception):
                    task.print_stack(limit=12, file=out)
        out.flush()
        faulthandler.dump_traceback(file=out, all_threads=True)

    def record(self, event: str, **values: Any) -> None:
        line = json.dumps({"ev": event, "t": time.time(), "pid": os.getpid(), **values})
        os.write(self._history, line.encode() + b"\n")

    def sending(self) -> bool:
        """Keep sending: not stopped, and the runner has not declared the quiet period."""
        if self.stop.is_set():
            return False
        with contextlib.suppress(OSError):
            return (self.run_dir / "phase").read_text().strip() == "faults"
        return False

    def write_status(self, **values: Any) -> None:
        """Update the status and write it (every half second by the heartbeat)."""
        self.status.update(values, t=time.time(), sending=self.sending())
        path = self.run_dir / "status" / f"{self.spec.name}.json"
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(self.status))
        temporary.replace(path)

    async def heartbeat(self) -> None:
        """The status, every half second, from the event loop: a loop that blocks stops it."""
        while not self.stop.is_set():
            self.write_status()
            await asyncio.sleep(0.5)

    def heartbeat_thread(self) -> threading.Thread:
        """The status, every half second, from a thread (sync workers)."""

        def beat() -> None:
            while not self.stop.wait(0.5):
                self.write_status()

        thread = threading.Thread(target=beat, name="soak-heartbeat", daemon=True)
        thread.start()
        return thread

    def ledger(self) -> Any:
        from georep import ParquetLedger

        # The default 5 s flush: what a SIGKILL takes from the ledger the checker recovers
        # from the history, and a shorter one writes a file a second per process (a
        # 30-minute soak: tens of thousands of small files for the checker to read).
        return ParquetLedger(self.run_dir / "ledger")

    def outbox(self) -> Any:
        from georep import SqliteOutbox

        return SqliteOutbox(self.run_dir / "outbox" / f"{self.spec.name}.sqlite")

    def roles(self) -> Any:
        from georep.adapters.redis import RedisRoleStore

        return RedisRoleStore.from_url(self.spec.redis_url, app=APP, operation_timeout=1.0)


def _message(spec: WorkerSpec, number: int) -> tuple[Any, dict[str, Any]]:
    from azure.servicebus import ServiceBusMessage

    message_id = f"{spec.name}.{spec.incarnation}.{number}"
    session = spec.sessions[number % len(spec.sessions)] if spec.sessions else None
    seq = number // len(spec.sessions) if spec.sessions else number
    body = {"id": message_id, "session": session, "seq": seq, "writer": spec.name}
    return (
        ServiceBusMessage(json.dumps(body), message_id=message_id, session_id=session),
        body,
    )


_RETRY_SECONDS = 0.2
#: The files faulthandler writes stacks to, kept open until the process ends.
_STACK_FILES: list[Any] = []


async def _send_async(worker: _Worker) -> None:
    from georep import GeoSender, PairedNamespaceOptions, PairedSender

    worker.loops.append(asyncio.get_running_loop())

    spec = worker.spec
    names = _entity_names(spec)
    ledger, outbox, roles = worker.ledger(), None, None
    if spec.mode == "paired":
        sender: Any = PairedSender.from_connection_strings(
            spec.primary,
            spec.secondary,
            primary_namespace=spec.primary_namespace,
            options=PairedNamespaceOptions(**PAIRED_OPTIONS),
            ledger=ledger,
            **names,
        )
    else:
        outbox, roles = worker.outbox(), worker.roles()
        sender = GeoSender.from_connection_strings(
            spec.primary,
            spec.secondary,
            mode=spec.mode,
            policy=_policy(),
            partitioned=spec.partitioned,
            outbox=outbox,
            ledger=ledger,
            role_store=roles,
            **names,
        )
    beat = asyncio.create_task(worker.heartbeat())
    try:
        async with sender:
            worker.status["ready"] = True
            await _send_loop_async(worker, sender)
    finally:
        worker.stop.set()
        await beat
        for owned in (outbox, roles, ledger):
            if owned is not None:
                await owned.aclose()


async def _send_loop_async(worker: _Worker, sender: Any) -> None:
    spec, number, started = worker.spec, 0, time.monotonic()
    acked = 0
    while not worker.stop.is_set():
        if worker.sending():
            message, body = _message(spec, number)
            try:
                result = await sender.send_messages(message)
            except Exception as exc:  # not acknowledged: the application retries the same id
                worker.status["errors"] += 1
                worker.status["last_error"] = type(exc).__name__
                await asyncio.sleep(_RETRY_SECONDS)
                continue
            queued = bool(getattr(result, "queued", False))
            worker.record("ack", entity=spec.entity, mode=spec.mode, queued=queued, **body)
            number, acked = number + 1, acked + 1
            due = started + number / spec.rate
            await asyncio.sleep(max(0.0, due - time.monotonic()))
        else:
            await asyncio.sleep(0.2)
        worker.status.update(
            acked=acked, active_region=sender.active_region if spec.mode == "passive" else None
        )


def _send_sync(worker: _Worker) -> None:
    import georep.sync
    from georep.adapters.redis import RedisRoleStore

    spec = worker.spec
    sender = georep.sync.GeoSender.from_connection_strings(
        spec.primary,
        spec.secondary,
        mode=spec.mode,
        policy=_policy(),
        partitioned=spec.partitioned,
        outbox=worker.outbox(),
        ledger=worker.ledger(),
        role_store=RedisRoleStore.from_url(spec.redis_url, app=APP, operation_timeout=1.0),
        **_entity_names(spec),
    )
    number, acked, started = 0, 0, time.monotonic()
    beat = worker.heartbeat_thread()
    with sender:
        worker.status["ready"] = True
        while not worker.stop.is_set():
            if worker.sending():
                message, body = _message(spec, number)
                try:
                    result = sender.send_messages(message)
                except Exception as exc:
                    worker.status["errors"] += 1
                    worker.status["last_error"] = type(exc).__name__
                    time.sleep(_RETRY_SECONDS)
                    continue
                worker.record(
                    "ack", entity=spec.entity, mode=spec.mode, queued=bool(result.queued), **body
                )
                number, acked = number + 1, acked + 1
                time.sleep(max(0.0, started + number / spec.rate - time.monotonic()))
            else:
                time.sleep(0.2)
            worker.status.update(
                acked=acked, active_region=sender.active_region if spec.mode == "passive" else None
            )
    worker.stop.set()
    beat.join(5)


def _policy() -> Any:
    """5 s per attempt: the soak's faults last 2 to 8 s, and its senders should meet them
    by failing over. On a partitioned entity the sender warns (once, in its log) that
    Service Bus recommends more than 15 s, so that a fragment failing over inside its region
    is not taken for an outage; the soak's ``fragment-down`` is meant to be met by failing
    over."""
    from georep import FailoverPolicy

    return FailoverPolicy(attempt_timeout=5.0)


#: Rows of a Spark sender's input file, a file every ``_SPARK_FILE_SECONDS``.
_SPARK_FILE_SECONDS = 2.0


def _send_spark(worker: _Worker) -> None:
    """The Spark sink as a sender, as a user streams with it.

    The worker writes a JSON file of ``rate * 2`` rows every 2 s into an input directory; a
    streaming query reads them (one file per micro-batch) and writes them with
    ``writeStream.format("georep")`` (passive mode) to the queue. A row is acknowledged
    when its micro-batch commits (``commits/N`` in the checkpoint): from then on Spark never
    sends it again. A batch cut short by a kill or a failed send is sent again, by this
    query or by the next incarnation's on the same checkpoint, with the same MessageIds
    (the rows' ``message_id``), and the receivers' seen-set processes each once. A failed
    query (both regions refusing, say) is started again from its checkpoint, as an
    application's supervisor would.
    """
    from georep.adapters.spark import register, spark_session

    spec = worker.spec
    base = Path(spec.run_dir) / "spark" / spec.name
    inbox, staging, checkpoint = base / "inbox", base / "staging", base / "checkpoint"
    for directory in (inbox, staging, checkpoint):
        directory.mkdir(parents=True, exist_ok=True)
    # The heartbeat first: Spark takes a while to start on a busy machine. Rows an earlier
    # incarnation wrote that no batch committed keep the system from being quiet.
    beat = worker.heartbeat_thread()
    committed_files = _CommittedFiles(checkpoint)
    worker.status["pending"] = len(_input_files(inbox) - committed_files())
    spark: Any = None
    query: Any = None
    acked_files: set[str] = set()
    number, written, started = 0, 0, time.monotonic()
    try:
        spark = spark_session(
            "local[1, 3]",  # one core, and a failed task tried up to 3 times
            app_name=f"georep-soak-{spec.name}",
            config={
                # The file source's log uncompacted, and no batch's logs purged (Spark keeps
                # the last 100 by default): the batch of each file, and whether it
                # committed, stay readable for a restarted incarnation (a 30-minute soak
                # runs about 900 batches; with the default, every file older than the last
                # 100 batches looked uncommitted to it, and the run never went quiet).
                "spark.sql.streaming.fileSource.log.compactInterval": "1000000",
                "spark.sql.streaming.minBatchesToRetain": "1000000",
                "spark.sql.shuffle.partitions": "1",
            },
        )
        register(spark)
        while not worker.stop.is_set():
            if query is None or not query.isActive:
                if query is not None:
                    worker.status["errors"] += 1
                    worker.status["last_error"] = str(query.exception())[:300]
                    time.sleep(1.0)
                discard_interrupted_writes(checkpoint)
                query = _start_spark_query(spark, spec, inbox, checkpoint)
                worker.status["ready"] = True
            if worker.sending() and time.monotonic() >= started + written * _SPARK_FILE_SECONDS:
                rows = max(1, round(spec.rate * _SPARK_FILE_SECONDS))
                lines = []
                for _ in range(rows):
                    _, body = _message(spec, number)
                    row = {"message_id": body["id"], "body": json.dumps(body)}
                    lines.append(json.dumps(row))
                    number += 1
                name = f"{spec.incarnation:04d}-{written:06d}.json"
                (staging / name).write_text("\n".join(lines) + "\n")
                os.replace(staging / name, inbox / name)  # whole, or not there
                written += 1
            for path in committed_files() - acked_files:
                for line in Path(path).read_text().splitlines():
                    body = json.loads(json.loads(line)["body"])
                    worker.record("ack", entity=spec.entity, mode="passive", queued=False, **body)
                acked_files.add(path)
            waiting = _input_files(inbox) - acked_files
            worker.status.update(acked_files=len(acked_files), pending=len(waiting))
            time.sleep(0.5)
    finally:
        worker.stop.set()
        if query is not None:
            with contextlib.suppress(Exception):
                query.stop()
        if spark is not None:
            spark.stop()
        beat.join(5)


def discard_interrupted_writes(checkpoint: Path) -> list[Path]:
    """Delete the temporary files of checkpoint writes a kill cut short; return them.

    Spark writes each log entry to ``.<batch>.<uuid>.tmp`` (and its ``.crc``) and renames
    it into place, so a leftover one is a write that never happened. Spark 4.1 and later
    refuse to start a query whose checkpoint has no offsets but a non-empty ``offsets``
    directory (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``): a kill while the first
    batch's offsets were being written left a query that never started again (CI's soak,
    seed 28). Call only while no query runs on ``checkpoint``.
    """
    leftovers = [
        path
        for path in checkpoint.rglob(".*")
        if path.is_file() and path.name.endswith((".tmp", ".tmp.crc"))
    ]
    for path in leftovers:
        path.unlink(missing_ok=True)
    return leftovers


def _start_spark_query(spark: Any, spec: WorkerSpec, inbox: Path, checkpoint: Path) -> Any:
    return (
        spark.readStream.schema("message_id string, body string")
        .option("maxFilesPerTrigger", 1)
        .json(str(inbox))
        .writeStream.format("georep")
        .options(
            primaryConnectionString=spec.primary,
            secondaryConnectionString=spec.secondary,
            queueName=spec.entity,
            mode="passive",
            attemptTimeoutSeconds="5",
        )
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="1 second")
        .start()
    )


def _input_files(inbox: Path) -> set[str]:
    """The input files written so far, as absolute real paths: Spark's logs name them so,
    and the soak's report directory may be given relative (``soak-report``, as CI runs it)."""
    return {os.path.realpath(path) for path in inbox.glob("*.json")}


class _CommittedFiles:
    """The input files of the micro-batches a checkpoint says committed (local paths),
    read incrementally: a file source log entry is written once, so each is parsed once (a
    30-minute soak leaves about a thousand).

    A micro-batch's offsets (``offsets/N``) name the last file source log entry it read
    (``logOffset``); the two numbers are not the same: a query killed after its file
    source logged a batch's file and before it wrote the batch's offsets leaves an entry
    that the next incarnation's first batch reads along with the next one, and from then
    on the batch numbers run one behind. Mapping batch N to log entry N left the last
    file "pending" for ever (CI's soak, seed 28, never went quiet)."""

    def __init__(self, checkpoint: Path) -> None:
        self.checkpoint = checkpoint
        self._files: dict[int, list[str]] = {}

    def __call__(self) -> set[str]:
        with contextlib.suppress(OSError):
            commits = (self.checkpoint / "commits").iterdir()
            committed = [int(p.name) for p in commits if p.name.isdigit()]
            if not committed:
                return set()
            last = self._log_offset(max(committed))
            for entry in range(last + 1):
                if entry not in self._files:
                    self._files[entry] = self._read(entry)
            return {path for entry in range(last + 1) for path in self._files[entry]}
        return set()

    def _log_offset(self, batch: int) -> int:
        """The last file source log entry ``batch`` read (``batch`` itself when its offsets
        cannot be read)."""
        with contextlib.suppress(OSError):
            for line in (self.checkpoint / "offsets" / str(batch)).read_text().splitlines()[2:]:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    return int(json.loads(line)["logOffset"])
        return batch

    def _read(self, entry: int) -> list[str]:
        """The files of log ``entry``, from its own file or the compacted one that holds it."""
        logs = self.checkpoint / "sources" / "0"
        files = []
        for log in (logs / str(entry), *sorted(logs.glob("*.compact"))):
            with contextlib.suppress(OSError):
                for line in log.read_text(errors="replace").splitlines()[1:]:  # after "v1"
                    with contextlib.suppress(ValueError, KeyError, TypeError):
                        record = json.loads(line)
                        if record["batchId"] == entry:
                            files.append(os.path.realpath(unquote(urlparse(record["path"]).path)))
            if files:
                break
        return files


def _entity_names(spec: WorkerSpec) -> dict[str, Any]:
    if "/Subscriptions/" in spec.entity:
        topic, subscription = spec.entity.split("/Subscriptions/")
        return {"topic_name": topic, "subscription_name": subscription}
    return {"topic_name" if spec.topic else "queue_name": spec.entity}


def _receiver_options(worker: _Worker) -> dict[str, Any]:
    from georep.adapters.redis import RedisSeenSet

    spec = worker.spec
    seen = RedisSeenSet.from_url(
        spec.seen_url or spec.redis_url,
        cluster=spec.seen_cluster,
        group=spec.entity.replace("/", ":"),
        window=3600,
    )
    options: dict[str, Any] = {
        "seen": seen,
        "concurrency": 8,
        "max_wait": 0.5,
        "lease": 15.0,
        "ledger": worker.ledger(),
        **_entity_names(spec),
    }
    if spec.receive_sessions:
        options.update(sessions=True, max_sessions=8, order_wait=30.0)
    return options


def _handled(worker: _Worker, message: Any) -> None:
    body = json.loads(str(message))
    worker.record("handled", entity=worker.spec.entity, **body)
    worker.status["handled"] = worker.status.get("handled", 0) + 1


async def _receive_async(worker: _Worker) -> None:
    from georep import GeoReceiver

    worker.loops.append(asyncio.get_running_loop())

    options = _receiver_options(worker)
    ledger, seen = options["ledger"], options["seen"]
    receiver = GeoReceiver.from_connection_strings(
        worker.spec.primary, worker.spec.secondary, **options
    )

    async def handle(message: Any) -> None:
        _handled(worker, message)

    try:
        await _serve(
            worker, receiver.run(handle), receiver, lambda: {"stats": _receiver_stats(receiver)}
        )
    finally:
        await seen.aclose()
        await ledger.aclose()


async def _serve(
    worker: _Worker, run: Coroutine[Any, Any, None], owner: Any, status: Callable[[], Any]
) -> None:
    """Run ``run`` (a receiver's or the syphon's) until SIGTERM, the heartbeat beside it;
    then close ``owner`` and wait for ``run`` to end. Its error, if it ended on one, is
    raised (the worker exits with it, and the runner sees a dead process)."""
    task = asyncio.create_task(run)
    beat = asyncio.create_task(worker.heartbeat())
    worker.status["ready"] = True
    try:
        while not worker.stop.is_set() and not task.done():
            worker.status.update(status())
            await asyncio.sleep(0.5)
    finally:
        worker.stop.set()
        await beat
        await owner.aclose()
        with contextlib.suppress(Exception):
            await wait_within(task, 15)
    if task.done() and not task.cancelled() and (error := task.exception()) is not None:
        raise error


def _receive_sync(worker: _Worker) -> None:
    import georep.sync

    options = _receiver_options(worker)
    receiver = georep.sync.GeoReceiver.from_connection_strings(
        worker.spec.primary, worker.spec.secondary, **options
    )
    runner = threading.Thread(target=receiver.run, args=(lambda m: _handled(worker, m),))
    runner.start()
    beat = worker.heartbeat_thread()
    worker.status["ready"] = True
    while not worker.stop.is_set() and runner.is_alive():
        worker.status.update(stats=_receiver_stats(receiver))
        time.sleep(0.5)
    worker.stop.set()
    receiver.close()
    runner.join(15)
    beat.join(5)


def _receiver_stats(receiver: Any) -> dict[str, Any]:
    stats = receiver.stats
    return {
        "received": sum(stats.received.values()),
        "suppressed": sum(stats.suppressed.values()),
    }


async def _syphon(worker: _Worker) -> None:
    from georep import PairedNamespaceOptions, Syphon

    worker.loops.append(asyncio.get_running_loop())

    spec = worker.spec
    syphon = Syphon.from_connection_strings(
        spec.primary,
        spec.secondary,
        primary_namespace=spec.primary_namespace,
        options=PairedNamespaceOptions(**PAIRED_OPTIONS),
    )
    await _serve(worker, syphon.run(), syphon, lambda: {"moved": syphon.stats.moved})


def main(argv: list[str] | None = None) -> int:
    """Run the worker described by the JSON spec in ``argv[0]``; 0 when it was stopped."""
    spec = WorkerSpec(**json.loads((argv or sys.argv[1:])[0]))
    logging.basicConfig(
        level=logging.WARNING, format=f"%(asctime)s {spec.name} %(levelname)s %(name)s %(message)s"
    )
    worker = _Worker(spec)
    worker.write_status(started=time.time())
    if spec.role == "sender" and spec.spark:
        _send_spark(worker)
    elif spec.role == "sender" and spec.sync:
        _send_sync(worker)
    elif spec.role == "sender":
        asyncio.run(_send_async(worker))
    elif spec.role == "receiver" and spec.sync:
        _receive_sync(worker)
    elif spec.role == "receiver":
        asyncio.run(_receive_async(worker))
    elif spec.role == "syphon":
        asyncio.run(_syphon(worker))
    else:
        raise SystemExit(f"unknown role {spec.role!r}")
    worker.write_status(stopped=time.time())
    # What could keep the process from exiting (the runner waits 20 s, then dumps stacks).
    lingering = [t.name for t in threading.enumerate() if not t.daemon and t.is_alive()]
    if len(lingering) > 1:
        _log.warning("threads still running at exit: %s", ", ".join(lingering))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
