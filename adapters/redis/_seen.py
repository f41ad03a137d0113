"""The seen-set on Redis: digests in time-bucketed hashes, one Lua script call per hash.

An id's 128-bit BLAKE2b digest picks one of ``hashes`` hash tags (its first 32 bits) and is
stored as a 12-byte field (the other 96 bits). Per tag the store keeps:

- ``{tag}:<bucket>``, one hash per time bucket as long as the window: field -> the id's
  outcome and, in units of window/2048, when it stops counting (an integer for done,
  ``'F'`` + units deferred, ``'D'`` + units dead-lettered). A bucket expires as a whole once
  its last entry's window has run out, so no entry carries a TTL of its own.
- ``{tag}:c``, the claims: field -> ``deadline_ms|owner`` (a lease is a deadline in the
  value, checked against the server's clock; the hash expires after the latest lease).
- ``{tag}:r``, dead-letter reasons: field -> reason (rare, and longer than the compact
  encoding allows, so kept out of the buckets).

Small hashes are stored by Redis as listpacks (up to ``hash-max-listpack-entries``, 128 by
default): a done id then costs its 12 bytes plus about 5, instead of a key of its own.
Every key a call touches carries the same hash tag, so each script call stays in one slot
of a Redis Cluster while the tags spread the load over every shard. A method sends one
script call per tag in its batch, all in one pipeline: one round trip on a single Redis,
one per node, concurrently, on a cluster.

Keys of the previous layout (one string key per id: ``prefix + group + ":" + digest``) are
still read by claims on a single Redis until they expire (``read_legacy_keys``).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Final

import redis.asyncio
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from georep._lifecycle import AsyncResource
from georep._outcomes import check_commit
from georep._policy import count, positive_seconds
from georep.exceptions import ConfigurationError, StoreUnavailableError
from georep.ports import Claims, ClaimState

__all__ = ["RedisSeenSet"]

DEFAULT_WINDOW: Final = timedelta(hours=24)
DEFAULT_OPERATION_TIMEOUT: Final = 2.0
DEFAULT_EXPECTED_IDS: Final = 1_000_000

IDS_PER_HASH: Final = 64
"""Ids per hash at ``expected_ids``: half of Redis' default hash-max-listpack-entries, so a
window twice as busy as expected still stays compact."""
UNITS_PER_WINDOW: Final = 2048
"""An entry's end is kept in units of window/2048: a 13-bit integer (2 bytes in a listpack)
that rounds the window up by at most 1/2048 of it."""
FIELD_BYTES: Final = 12
"""Bytes of the digest stored per id (the first 4 pick the hash): 96 bits; a new id is
taken for one of N remembered ids in the same hash with probability about N / 2**96."""

# KEYS: claims, reasons, bucket before, current bucket, bucket after, then (claims on a
# single Redis only) one previous-layout key per field.
# ARGV: operation, owner, milliseconds (the lease for claim/extend), window ms, the current
# bucket's start (ms, the client's clock), the unit (ms), the fields, and for commit one
# outcome per field ('1', 'F', or 'D' .. reason).
# Returns one answer per field. Claim: 0 claimed, 1 in flight, 2 done, 4 deferred, or
# 'D' .. reason for dead-lettered; the others 1 where they changed the field.
# The server's clock decides leases and windows; the client's only picks the bucket keys,
# and the buckets either side of the current one are read too, so clients whose clocks
# disagree by less than a window still find each other's entries.
_SCRIPT: Final = """
local op, owner = ARGV[1], ARGV[2]
local ms, window = tonumber(ARGV[3]), tonumber(ARGV[4])
local start, unit = tonumber(ARGV[5]), tonumber(ARGV[6])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local claims, reasons, bucket = KEYS[1], KEYS[2], KEYS[4]
local count = #ARGV - 6
if op == 'm' then count = count / 2 end
local answers = {}

local function keep_until(key, ends)
  local left = ends - now
  if left > 0 and redis.call('PTTL', key) < left then
    redis.call('PEXPIRE', key, left)
  end
end

local function holder(field)
  local held = redis.call('HGET', claims, field)
  if not held then return nil end
  local bar = string.find(held, '|', 1, true)
  return string.sub(held, bar + 1), tonumber(string.sub(held, 1, bar - 1))
end

-- The outcome still counting for a field: 'done', 'F' or 'D'; the current bucket first.
local function outcome(field)
  for _, k in ipairs({4, 3, 5}) do
    local value = redis.call('HGET', KEYS[k], field)
    if value then
      local kind, units = 'done', tonumber(value)
      if not units then
        kind, units = string.sub(value, 1, 1), tonumber(string.sub(value, 2))
      end
      if start + (k - 4) * window + window + units * unit > now then
        return kind
      end
    end
  end
  return nil
end

if op == 'c' then
  local deadline, claimed = now + ms, false
  -- A claim nobody committed or released (its holder vanished and its message never came
  -- back) would stay as long as new claims keep the hash alive: each call drops one
  -- random claim if its lease ran out.
  local sample = redis.call('HRANDFIELD', claims, 1, 'WITHVALUES')
  if sample[2] then
    local bar = string.find(sample[2], '|', 1, true)
    if tonumber(string.sub(sample[2], 1, bar - 1)) <= now then
      redis.call('HDEL', claims, sample[1])
    end
  end
  local legacy = #KEYS > 5
  for i = 1, count do
    local field = ARGV[6 + i]
    local kind, answer = outcome(field), nil
    if kind == 'done' then
      answer = 2
    elseif kind == 'F' then
      answer = 4
    elseif kind == 'D' then
      answer = 'D' .. (redis.call('HGET', reasons, field) or '')
    elseif legacy then
      local old = redis.call('GET', KEYS[5 + i])
      if old == '1' then
        answer = 2
      elseif old == 'F' then
        answer = 4
      elseif old and string.sub(old, 1, 1) == 'D' then
        answer = old
      elseif old and old ~= 'c' .. owner then
        answer = 1
      end
    end
    if not answer then
      local other, ends = holder(field)
      if other and other ~= owner and ends > now then
        answer = 1
      else
        redis.call('HSET', claims, field, deadline .. '|' .. owner)
        claimed, answer = true, 0
      end
    end
    answers[i] = answer
  end
  if claimed then keep_until(claims, deadline) end
  return answers
end

if op == 'm' then
  local units = math.ceil((now - start) / unit)
  local dead = false
  for i = 1, count do
    local field, recorded = ARGV[6 + i], ARGV[6 + count + i]
    local kind = string.sub(recorded, 1, 1)
    if kind == '1' then
      redis.call('HSET', bucket, field, units)
    else
      redis.call('HSET', bucket, field, kind .. units)
      if kind == 'D' then
        redis.call('HSET', reasons, field, string.sub(recorded, 2))
        dead = true
      end
    end
    redis.call('HDEL', claims, field)
    answers[i] = 1
  end
  local ends = start + window + units * unit
  keep_until(bucket, ends)
  if dead then keep_until(reasons, ends) end
  return answers
end

if op == 'r' or op == 'e' then
  local deadline, extended = now + ms, false
  for i = 1, count do
    local field = ARGV[6 + i]
    local other, ends = holder(field)
    answers[i] = 0
    if other == owner then
      if op == 'r' then
        redis.call('HDEL', claims, field)
        answers[i] = 1
      elseif ends > now then
        redis.call('HSET', claims, field, deadline .. '|' .. owner)
        extended, answers[i] = true, 1
      end
    end
  end
  if extended then keep_until(claims, deadline) end
  return answers
end
return redis.error_reply('georep seen-set: unknown operation ' .. tostring(op))
"""

_CLAIM, _COMMIT, _RELEASE, _EXTEND = "c", "m", "r", "e"
_NO_VALUES: Final[tuple[bytes, ...]] = ()


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


_CLAIM_STATES: Final = {
    0: ClaimState.CLAIMED,
    1: ClaimState.IN_FLIGHT,
    2: ClaimState.DONE,
    4: ClaimState.DEFERRED,
}
_STORED: Final = {ClaimState.DONE: b"1", ClaimState.DEFERRED: b"F", ClaimState.DEAD_LETTERED: b"D"}
_STORE_ERRORS: Final = (RedisError, RedisClusterException, OSError)  # OSError: TimeoutError


def _milliseconds(value: float) -> int:
    # Leases and windows are whole milliseconds; round up so a tiny one is never 0.
    return max(1, math.ceil(value * 1000))


class RedisSeenSet(AsyncResource):
    """A :class:`georep.ports.SeenStore` on Redis or Redis Cluster, shared by every receiver.

    Build it with :meth:`from_url` (the store creates its client and closes it), or give
    the constructor a ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster`` client
    (borrowed: used as configured, never closed by the store), as redis-py's ``from_url``
    versus its constructor.

    Args:
        url_or_client: A ``redis.asyncio.Redis`` or ``RedisCluster`` client (borrowed), or
            a URL (as :meth:`from_url`: the store owns the client it creates).
        group: Receivers that deduplicate against each other share a group. Default
            ``"default"``.
        prefix: Prepended to every key: ``f"{prefix}{group}:"``. Default ``"georep:seen:"``.
        window: How long a processed key stays done, in seconds or a ``timedelta``
            (rounded up by at most 1/2048 of it). Default 24 hours. A copy arriving later
            than this is processed again.
        operation_timeout: Most seconds one call may take, retries and reconnects
            included. Default 2.0.
        cluster: With a URL: connect to a Redis Cluster through that node
            (``RedisCluster.from_url``). Default False.
        expected_ids: Ids committed per window the key layout is sized for: the store
            spreads them over ``expected_ids / 64`` hashes (a power of two) per time
            bucket, small enough for Redis' compact hash encoding up to about twice this
            figure. Every receiver of a group must use the same value. Default 1,000,000.
        read_legacy_keys: Claims on a single Redis also read the one-key-per-id entries an
            earlier georep wrote (about one extra ``GET`` per id); turn off one window after
            upgrading. Never on a cluster (those keys live in other slots). Default True.

    Attributes:
        round_trips: Exchanges with Redis so far (one per non-empty call, plus one each
            for reloading the script after a server restart, failover or ``SCRIPT FLUSH``).

    Raises:
        ConfigurationError: ``window``, ``operation_timeout`` or ``expected_ids`` is not
            positive. Raised by the first call instead: the group's ids are already spread
            for another ``expected_ids`` (the key ``prefix + group + ":layout"`` records it).
    """

    def __init__(
        self,
        url_or_client: str | redis.asyncio.Redis | RedisCluster,
        *,
        group: str = "default",
        prefix: str = "georep:seen:",
        window: float | timedelta = DEFAULT_WINDOW,
        operation_timeout: float = DEFAULT_OPERATION_TIMEOUT,
        cluster: bool = False,
        expected_ids: int = DEFAULT_EXPECTED_IDS,
        read_legacy_keys: bool = True,
    ) -> None:
        self._window_ms = _milliseconds(positive_seconds(window, "window"))
        self._unit_ms = max(1, self._window_ms // UNITS_PER_WINDOW)
        self._operation_timeout = positive_seconds(operation_timeout, "operation_timeout")
        wanted = count(expected_ids, "expected_ids")
        self._hash_mask = (1 << max(0, math.ceil(math.log2(wanted / IDS_PER_HASH)))) - 1
        self._key_prefix = f"{prefix}{group}:".encode()
        self._owns_client = isinstance(url_or_client, str)
        self._redis: redis.asyncio.Redis | RedisCluster
        if isinstance(url_or_client, str):
            timeouts: dict[str, Any] = {
                "socket_timeout": self._operation_timeout,
                "socket_connect_timeout": self._operation_timeout,
            }
            if cluster:
                # The cluster client follows MOVED/ASK itself and, on CLUSTERDOWN or a lost
                # node, reloads the slot map and tries again: a few quick attempts ride out
                # a failover's redirections; the operation_timeout deadline bounds them all.
                self._redis = RedisCluster.from_url(
                    url_or_client,
                    retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), 5),
                    **timeouts,
                )
            else:
                # One quick reconnect covers a pooled connection the server dropped; more
                # would only delay the StoreUnavailableError receivers pause on.
                self._redis = redis.asyncio.Redis.from_url(
                    url_or_client, retry=Retry(NoBackoff(), 1), **timeouts
                )
        else:
            self._redis = url_or_client
        # A permanent key per group: how many hashes its ids are spread over.
        self._layout = (self._key_prefix + b"layout", b"hashes=%d" % (self._hash_mask + 1))
        self._layout_checked = False
        self._cluster = isinstance(self._redis, RedisCluster)
        self._read_legacy = read_legacy_keys and not self._cluster
        self._sha: bytes = hashlib.sha1(_SCRIPT.encode()).hexdigest().encode()
        # Picks the time bucket only (the server's clock decides leases and windows); a
        # test sets it to play a receiver whose clock is off.
        self._wall_clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)
        self.round_trips = 0

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        group: str = "default",
        prefix: str = "georep:seen:",
        window: float | timedelta = DEFAULT_WINDOW,
        operation_timeout: float = DEFAULT_OPERATION_TIMEOUT,
        cluster: bool = False,
        expected_ids: int = DEFAULT_EXPECTED_IDS,
        read_legacy_keys: bool = True,
    ) -> RedisSeenSet:
        """A store on its own client for ``url``, closed by :meth:`aclose`.

        The client takes ``operation_timeout`` as socket and connect timeout. A single
        Redis gets one immediate reconnect, no backoff (a longer wait would only delay the
        StoreUnavailableError receivers pause on); a cluster client up to five quick
        retries (20-200 ms apart) through redirections and failovers, within the same
        deadline.

        Args:
            url: A ``redis://``, ``rediss://`` or ``unix://`` URL; with ``cluster=True``
                the ``redis://`` or ``rediss://`` URL of any node of the cluster (the client
                discovers the others), as ``redis.asyncio.RedisCluster.from_url`` takes it.
            group: As the constructor.
            prefix: As the constructor.
            window: As the constructor.
            operation_timeout: As the constructor.
            cluster: As the constructor.
            expected_ids: As the constructor.
            read_legacy_keys: As the constructor.

        Raises:
            ConfigurationError: ``window``, ``operation_timeout`` or ``expected_ids`` is not
                positive.
        """
        return cls(
            url,
            group=group,
            prefix=prefix,
            window=window,
            operation_timeout=operation_timeout,
            cluster=cluster,
            expected_ids=expected_ids,
            read_legacy_keys=read_legacy_keys,
        )

    @property
    def window(self) -> float:
        """Seconds a committed key stays done."""
        return self._window_ms / 1000

    async def claim(self, keys: Sequence[str], *, owner: str, lease: float) -> list[ClaimState]:
        """Claim each key for ``owner`` for ``lease`` seconds; their states in key order.

        Raises:
            ConfigurationError: ``lease`` is not positive.
            StoreUnavailableError: Redis did not answer in time or refused the call.
            ClosedError: The store was closed.
        """
        lease_ms = _milliseconds(positive_seconds(lease, "lease"))
        claims = Claims()
        for index, result in enumerate(await self._run(keys, _CLAIM, owner, lease_ms)):
            if isinstance(result, int):
                claims.append(_CLAIM_STATES[result])
            else:  # the stored 'D' + reason of a dead-lettered key
                text = result.decode("utf-8", "replace") if isinstance(result, bytes) else result
                claims.append(ClaimState.DEAD_LETTERED)
                claims.reasons[index] = text[1:]
        return claims

    async def commit(
        self,
        keys: Sequence[str],
        *,
        owner: str,
        outcome: ClaimState = ClaimState.DONE,
        reasons: Sequence[str] | None = None,
    ) -> None:
        """Record the keys' final outcome for the window, whoever holds them.

        Raises:
            ConfigurationError: ``outcome`` is not final, or ``reasons`` is not one per key.
            StoreUnavailableError: Redis did not answer in time or refused the call.
            ClosedError: The store was closed.
        """
        texts = check_commit(keys, outcome, reasons)
        stored = _STORED[outcome]
        if outcome is ClaimState.DEAD_LETTERED:
            values = [stored + text.encode("utf-8", "replace") for text in texts]
        else:
            values = [stored] * len(keys)
        await self._run(keys, _COMMIT, owner, 0, values)

    async def release(self, keys: Sequence[str], *, owner: str) -> None:
        """Drop ``owner``'s claims on the keys; done keys and others' claims stay.

        Raises:
            StoreUnavailableError: Redis did not answer in time or refused the call.
            ClosedError: The store was closed.
        """
        await self._run(keys, _RELEASE, owner, 0)

    async def extend(self, keys: Sequence[str], *, owner: str, lease: float) -> list[bool]:
        """Renew ``owner``'s claims for ``lease`` seconds; False where it no longer holds one.

        Raises:
            ConfigurationError: ``lease`` is not positive.
            StoreUnavailableError: Redis did not answer in time or refused the call.
            ClosedError: The store was closed.
        """
        lease_ms = _milliseconds(positive_seconds(lease, "lease"))
        return [result == 1 for result in await self._run(keys, _EXTEND, owner, lease_ms)]

    async def aclose(self) -> None:
        """Close the client if the store created it (from a URL); idempotent and shielded."""
        await super().aclose()

    async def _close(self) -> None:
        if self._owns_client:
            await self._redis.aclose()

    async def _run(
        self,
        keys: Sequence[str],
        operation: str,
        owner: str,
        ms: int,
        outcomes: Sequence[bytes] = _NO_VALUES,
    ) -> list[Any]:
        """Run the script once per hash tag the keys fall in, all in one pipeline; the
        script's answers in key order.

        ``outcomes`` (commit only) holds one recorded outcome per key.
        """
        self._check_open()
        if not keys:
            return []
        calls = self._calls(keys, operation, owner, ms, outcomes)
        deadline = asyncio.timeout(self._operation_timeout)
        try:
            async with deadline:
                answers = await self._pipelined([arguments for _, arguments in calls])
        except _STORE_ERRORS as exc:
            raise self._unavailable(exc, deadline_passed=deadline.expired()) from exc
        results: list[Any] = [None] * len(keys)
        for (positions, _), answer in zip(calls, answers, strict=True):
            for position, result in zip(positions, answer, strict=True):
                # Integers, or a dead-lettered key's 'D' + reason (bytes, or str on a
                # client created with decode_responses=True).
                results[position] = result
        return results

    def _calls(
        self,
        keys: Sequence[str],
        operation: str,
        owner: str,
        ms: int,
        outcomes: Sequence[bytes],
    ) -> list[tuple[list[int], list[bytes]]]:
        """The script calls for a batch: per hash tag, the keys' positions and the EVALSHA
        arguments. Arguments go pre-encoded: redis-py would otherwise encode each one."""
        by_tag: dict[int, list[int]] = {}
        digests = [_digest(key.encode()) for key in keys]
        for position, digest in enumerate(digests):
            tag = int.from_bytes(digest[:4], "big") & self._hash_mask
            by_tag.setdefault(tag, []).append(position)
        bucket = self._wall_clock_ms() // self._window_ms
        header = [
            operation.encode(),
            owner.encode(),
            str(ms).encode(),
            str(self._window_ms).encode(),
            str(bucket * self._window_ms).encode(),
            str(self._unit_ms).encode(),
        ]
        buckets = [str(bucket + offset).encode() for offset in (-1, 0, 1)]
        legacy = self._read_legacy and operation == _CLAIM
        calls = []
        for tag, positions in by_tag.items():
            base = b"%s{%d}:" % (self._key_prefix, tag)
            keys_of_call = [base + b"c", base + b"r", *(base + name for name in buckets)]
            if legacy:
                keys_of_call += [self._key_prefix + digests[p] for p in positions]
            fields = [digests[p][4 : 4 + FIELD_BYTES] for p in positions]
            recorded = [outcomes[p] for p in positions] if outcomes else []
            arguments = [
                self._sha,
                str(len(keys_of_call)).encode(),
                *keys_of_call,
                *header,
                *fields,
                *recorded,
            ]
            calls.append((positions, arguments))
        return calls

    async def _pipelined(self, calls: list[list[bytes]]) -> list[Any]:
        results: list[Any] = [None] * len(calls)
        pending = list(range(len(calls)))
        # EVALSHA straight into the pipeline: redis-py's Script object would add a
        # SCRIPT EXISTS round trip to every pipeline. A NOSCRIPT answer (new or restarted
        # server, a replica that took over, SCRIPT FLUSH) loads the script and reruns only
        # the calls that got it. On a cluster the pipeline sends each node its calls, all
        # nodes at once.
        for attempt in range(2):
            pipe = self._redis.pipeline(transaction=False)
            check_layout = not self._layout_checked
            if check_layout:  # SET NX then GET: SET's NX and GET options go together on 7.0+
                pipe.setnx(*self._layout)
                pipe.get(self._layout[0])
            for index in pending:
                pipe.execute_command("EVALSHA", *calls[index])
            self.round_trips += 1
            answers = await pipe.execute(raise_on_error=False)
            if check_layout:
                answers.pop(0)
                self._check_layout(answers.pop(0))
            missing: list[int] = []
            for index, answer in zip(pending, answers, strict=True):
                if isinstance(answer, NoScriptError) and attempt == 0:
                    missing.append(index)
                elif isinstance(answer, Exception):
                    raise answer
                else:
                    results[index] = answer
            if not missing:
                break
            self.round_trips += 1
            await self._redis.script_load(_SCRIPT)  # on a cluster: on every master
            pending = missing
        return results

    def _check_layout(self, recorded: Any) -> None:
        """The first call of a store records (SETNX) how many hashes its group's ids are
        spread over; a store of the same group sized otherwise would look for them in other
        keys, and must not run."""
        if isinstance(recorded, Exception):
            raise recorded
        theirs = recorded.decode() if isinstance(recorded, bytes) else recorded
        ours = self._layout[1].decode()
        if theirs is not None and theirs != ours:
            key = self._layout[0].decode("utf-8", "replace")
            raise ConfigurationError(
                f"seen set: the group's ids are spread over {theirs} (key {key!r}), this "
                f"store's over {ours}: give every receiver of the group the same "
                "expected_ids (to change it, stop them all and delete that key)"
            )
        self._layout_checked = True

    def _unavailable(
        self, exc: BaseException, *, deadline_passed: bool = False
    ) -> StoreUnavailableError:
        """The one translation of a Redis client, cluster or socket failure into a georep
        error.

        The text names the server (host:port, socket path, or the cluster's startup nodes)
        and carries the client's own description, with the password scrubbed should it
        ever appear there.
        """
        if isinstance(self._redis, RedisCluster):
            connection: dict[str, Any] = self._redis.connection_kwargs
            nodes = ", ".join(self._redis.nodes_manager.startup_nodes) or "?"
            where = f"redis cluster at {nodes}"
        else:
            connection = self._redis.connection_pool.connection_kwargs
            if connection.get("path"):
                where = f"redis at unix:{connection['path']}"
            else:
                host, port = connection.get("host", "localhost"), connection.get("port", 6379)
                where = f"redis at {host}:{port}"
        description = str(exc) or type(exc).__name__
        password = connection.get("password")
        if password:
            description = description.replace(str(password), "***")
        if deadline_passed:
            detail = f"did not answer within {self._operation_timeout:g} s"
        elif isinstance(exc, RedisTimeoutError | TimeoutError):
            detail = f"did not answer in time ({type(exc).__name__}: {description})"
        elif isinstance(exc, RedisConnectionError | OSError | RedisClusterException):
            detail = f"cannot be reached ({type(exc).__name__}: {description})"
        else:
            detail = f"refused the seen-set call ({type(exc).__name__}: {description})"
        return StoreUnavailableError(f"seen set: {where} {detail}")
