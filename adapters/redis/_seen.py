"""The seen-set on Redis: digests in time-bucketed hashes, one Lua script call per batch.

An id's 128-bit BLAKE2b digest picks, by its first 32 bits, one of ``expected_ids / 64``
hashes; the other 96 bits (12 bytes) are its field, so a new id is taken for one of N
remembered ids with probability about N / 2**96. The hashes are dealt over
``slot_groups`` cluster hash tags, each tag in its own share of the 16,384 slots. With
``P = prefix + group + ":"``, per hash the store keeps:

- ``P{tag}:<hash>:<bucket>``, one hash per time bucket as long as the window: field -> the
  id's outcome and, in units of window/2048, when it stops counting (an integer for done,
  ``'F'`` + units deferred, ``'D'`` + units dead-lettered). A bucket expires as a whole once
  its last entry's window has run out, so no entry carries a TTL of its own.
- ``P{tag}:<hash>:c``, the claims: field -> ``deadline_ms|owner`` (a lease is a deadline in
  the value, checked against the server's clock; the hash expires after the latest lease).
- ``P{tag}:<hash>:r``, dead-letter reasons: field -> reason (rare, and longer than the
  compact encoding allows, so kept out of the buckets).

Small hashes are stored by Redis as listpacks (up to ``hash-max-listpack-entries``, 128 by
default): a done id then costs its 12 bytes plus about 5, instead of a key of its own.
On a Redis Cluster every key a script call touches carries the same hash tag, so each call
stays in one slot while the tags spread the load over the shards: a method sends one
script call per tag in its batch, all in one pipeline (one round trip per node,
concurrently). A single Redis has no slots: a method sends one script call for its whole
batch, naming every tag, and the script finds each id's.

Keys of the previous layout (one string key per id: ``prefix + group + ":" + digest``) are
still read by claims on a single Redis until they expire (``read_legacy_keys``).
"""

from __future__ import annotations

__all__ = ["RedisSeenSet"]

import asyncio
import hashlib
import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Final, TypedDict, Unpack

import redis.asyncio
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.crc import key_slot
from redis.exceptions import (
    ConnectionError as RedisConnectionError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    TimeoutError as RedisTimeoutError,
)

from georep._policy import count, positive_seconds
from georep.exceptions import ConfigurationError, StoreUnavailableError
from georep.ports import Claims, ClaimState
from georep.receive.dedup import _SeenSetBase

DEFAULT_WINDOW: Final = timedelta(hours=24)
DEFAULT_OPERATION_TIMEOUT: Final = 2.0
DEFAULT_EXPECTED_IDS: Final = 1_000_000

IDS_PER_HASH: Final = 64
"""Ids per hash at ``expected_ids``: half of Redis' default hash-max-listpack-entries, so a
window twice as busy as expected still stays compact."""
DEFAULT_SLOT_GROUPS: Final = 16
"""Hash tags the hashes are spread over by default, each in its own 1/16 of the 16,384
cluster slots: on a cluster a batch is at most 16 script calls (each call costs Redis more
than the ids in it), and a cluster whose masters hold even slot ranges (as ``redis-cli --cluster
create`` deals them) gets an even share, within 1/16, on each of up to 16 masters."""
UNITS_PER_WINDOW: Final = 2048
"""An entry's end is kept in units of window/2048: a 13-bit integer (2 bytes in a listpack)
that rounds the window up by at most 1/2048 of it."""

# KEYS: the slot groups, P{group}: on a cluster, one (the call's: a call stays in one
# slot); on a single Redis, every group in order, and each id's group is its hash modulo
# their number, as the client deals them (one call for a whole batch). The script names
# each id's keys after its group, P{group}:<hash>:c, :r and :<bucket> (same hash tag, so
# same slot): declaring them would cost the client more than the rest of the call.
# ARGV: 'operation ms window start unit hashes' (ms: the lease for claim/extend; start: the
# current bucket's start by the client's clock, all in milliseconds), the owner, the
# previous layout's key prefix ('' = do not read it; claims on a single Redis only), the
# 16-byte digests, and for commit one outcome per digest ('1', 'F', or 'D' .. reason).
# Returns one answer per digest. Claim: 0 claimed, 1 in flight, 2 done, 4 deferred, or
# 'D' .. reason for dead-lettered; peek: the same numbers, 3 dead-lettered, 5 no entry;
# the others 1 where they changed the entry.
# The server's clock decides leases and windows; the client's only picks the bucket keys,
# and the buckets either side of the current one are read too, so clients whose clocks
# disagree by less than a window still find each other's entries.
_SCRIPT: Final = """
local op, ms, window, start, unit, hashes =
  string.match(ARGV[1], '^(%a) (%d+) (%d+) (%d+) (%d+) (%d+)$')
ms, window, start, unit = tonumber(ms), tonumber(window), tonumber(start), tonumber(unit)
hashes = tonumber(hashes)
local owner, legacy = ARGV[2], ARGV[3]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local current = start / window
local count = #ARGV - 3
if op == 'm' then count = count / 2 end
local answers = {}
local keys_of = {}
local ends_of = {}

-- The keys of a digest's hash: claims, reasons, and the buckets before, now, after; and,
-- sixth, the index of its slot group in KEYS.
local function keys(digest)
  local a, b, c, d = string.byte(digest, 1, 4)
  local hash = (((a * 256 + b) * 256 + c) * 256 + d) % hashes
  local found = keys_of[hash]
  if not found then
    local group = hash % #KEYS + 1
    local base = KEYS[group] .. ':' .. hash .. ':'
    found = {base .. 'c', base .. 'r', base .. (current - 1), base .. current,
             base .. (current + 1), group}
    keys_of[hash] = found
  end
  return found
end

-- Keep ``key`` at least until ``ends``; applied once per key when the call is done. Callers
-- ask for more than they need (a claims hash: twice the lease; a bucket: until its last
-- possible entry ends), so that most calls find the TTL long enough and change nothing.
local function keep_until(key, ends)
  if (ends_of[key] or 0) < ends then ends_of[key] = ends end
end

local function holder(claims, field)
  local held = redis.call('HGET', claims, field)
  if not held then return nil end
  local bar = string.find(held, '|', 1, true)
  return string.sub(held, bar + 1), tonumber(string.sub(held, 1, bar - 1))
end

-- The outcome still counting for a field: 'done', 'F' or 'D'; the current bucket first.
local function outcome(k, field)
  for _, b in ipairs({4, 3, 5}) do
    local value = redis.call('HGET', k[b], field)
    if value then
      local kind, units = 'done', tonumber(value)
      if not units then
        kind, units = string.sub(value, 1, 1), tonumber(string.sub(value, 2))
      end
      if start + (b - 3) * window + units * unit > now then
        return kind
      end
    end
  end
  return nil
end

-- The entry an earlier georep wrote for a digest (one string key per id), read as outcome()
-- reads the buckets ('done', 'F' or 'D'; nil for a claim or no entry), and its value.
local function legacy_outcome(digest)
  local old = redis.call('GET', legacy .. digest)
  if old == '1' then return 'done', old end
  if old == 'F' then return 'F', old end
  if old and string.sub(old, 1, 1) == 'D' then return 'D', old end
  return nil, old
end

if op == 'c' then
  local deadline = now + ms
  -- A claim nobody committed or released (its holder vanished and its message never came
  -- back) would stay as long as new claims keep its hash alive: each call drops one random
  -- claim of the first claims hash it uses in each slot group, if its lease ran out.
  local swept = {}
  for i = 1, count do
    local digest = ARGV[3 + i]
    local field, k = string.sub(digest, 5), keys(digest)
    local claims = k[1]
    if not swept[k[6]] then
      swept[k[6]] = true
      local sample = redis.call('HRANDFIELD', claims, 1, 'WITHVALUES')
      if sample[2] then
        local bar = string.find(sample[2], '|', 1, true)
        if tonumber(string.sub(sample[2], 1, bar - 1)) <= now then
          redis.call('HDEL', claims, sample[1])
        end
      end
    end
    local kind, old, answer = outcome(k, field), nil, nil
    if not kind and legacy ~= '' then kind, old = legacy_outcome(digest) end
    if kind == 'done' then
      answer = 2
    elseif kind == 'F' then
      answer = 4
    elseif kind == 'D' then
      answer = old or ('D' .. (redis.call('HGET', k[2], field) or ''))
    elseif old and old ~= 'c' .. owner then
      answer = 1
    end
    if not answer then
      local other, ends = holder(claims, field)
      if other and other ~= owner and ends > now then
        answer = 1
      else
        redis.call('HSET', claims, field, deadline .. '|' .. owner)
        keep_until(claims, deadline + ms)
        answer = 0
      end
    end
    answers[i] = answer
  end
elseif op == 'm' then
  local units = math.ceil((now - start) / unit)
  local ends = start + window + units * unit
  local last = math.max(ends, start + 2 * window + unit)
  for i = 1, count do
    local digest, recorded = ARGV[3 + i], ARGV[3 + count + i]
    local field, k = string.sub(digest, 5), keys(digest)
    local kind = string.sub(recorded, 1, 1)
    if kind == '1' then
      redis.call('HSET', k[4], field, units)
    else
      redis.call('HSET', k[4], field, kind .. units)
      if kind == 'D' then
        redis.call('HSET', k[2], field, string.sub(recorded, 2))
        keep_until(k[2], last)
      end
    end
    keep_until(k[4], last)
    redis.call('HDEL', k[1], field)
    answers[i] = 1
  end
elseif op == 'p' then
  local numbers = {done = 2, F = 4, D = 3}
  for i = 1, count do
    local digest = ARGV[3 + i]
    local field, k = string.sub(digest, 5), keys(digest)
    local kind, old = outcome(k, field), nil
    if not kind and legacy ~= '' then kind, old = legacy_outcome(digest) end
    local answer = numbers[kind or ''] or (old and 1) or 5
    if answer == 5 then
      local other, ends = holder(k[1], field)
      if other and ends > now then answer = 1 end
    end
    answers[i] = answer
  end
elseif op == 'r' or op == 'e' then
  local deadline = now + ms
  for i = 1, count do
    local digest = ARGV[3 + i]
    local field, claims = string.sub(digest, 5), keys(digest)[1]
    local other, ends = holder(claims, field)
    answers[i] = 0
    if other == owner then
      if op == 'r' then
        redis.call('HDEL', claims, field)
        answers[i] = 1
      elseif ends > now then
        redis.call('HSET', claims, field, deadline .. '|' .. owner)
        keep_until(claims, deadline + ms)
        answers[i] = 1
      end
    end
  end
else
  return redis.error_reply('georep seen-set: unknown operation ' .. tostring(op))
end
for key, ends in pairs(ends_of) do
  local left = ends - now
  if left > 0 and redis.call('PTTL', key) < left then
    redis.call('PEXPIRE', key, left)
  end
end
return answers
"""

_CLAIM, _COMMIT, _RELEASE, _EXTEND, _PEEK = "c", "m", "r", "e", "p"
_NO_VALUES: Final[tuple[bytes, ...]] = ()


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


_CLAIM_STATES: Final = {
    0: ClaimState.CLAIMED,
    1: ClaimState.IN_FLIGHT,
    2: ClaimState.DONE,
    4: ClaimState.DEFERRED,
}
_PEEKED: Final = {**_CLAIM_STATES, 3: ClaimState.DEAD_LETTERED, 5: None}
_STORED: Final = {ClaimState.DONE: b"1", ClaimState.DEFERRED: b"F", ClaimState.DEAD_LETTERED: b"D"}
_STORE_ERRORS: Final = (RedisError, RedisClusterException, OSError)  # OSError: TimeoutError


def _slot_tag(group: int, groups: int) -> bytes:
    """A hash tag whose cluster slot lies in ``group``'s share of the 16,384 slots."""
    low, high = group * 16_384 // groups, (group + 1) * 16_384 // groups
    for attempt in itertools.count():
        tag = b"%d.%d" % (group, attempt)
        if low <= key_slot(tag) < high:
            return tag
    raise AssertionError("unreachable")  # pragma: no cover - count() never ends


def _milliseconds(value: float) -> int:
    # Leases and windows are whole milliseconds; round up so a tiny one is never 0.
    return max(1, math.ceil(value * 1000))


class RedisSeenSetOptions(TypedDict, total=False):
    """:class:`RedisSeenSet`'s keyword arguments, for :meth:`RedisSeenSet.from_url`."""

    group: str
    prefix: str
    window: float | timedelta
    operation_timeout: float
    cluster: bool
    expected_ids: int
    slot_groups: int
    read_legacy_keys: bool


class RedisSeenSet(_SeenSetBase):
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
            figure. Default 1,000,000.
        slot_groups: Cluster hash tags the hashes are spread over, each in its own share
            of the slots: a batch costs at most this many script calls, and a cluster
            spreads the load over up to this many masters. Raise it above 16 (the
            default) only for a cluster of more masters.
        read_legacy_keys: Claims on a single Redis also read the one-key-per-id entries an
            earlier georep wrote (about one extra ``GET`` per id); turn off one window after
            upgrading. Never on a cluster (those keys live in other slots). Default True.

    Every method follows :class:`georep.ports.SeenStore` (and
    :class:`~georep.ports.SessionStateStore`), and raises
    :class:`~georep.exceptions.StoreUnavailableError` when Redis did not answer in time or
    refused the call, :class:`~georep.exceptions.ClosedError` once the store is closed.

    Attributes:
        round_trips: Exchanges with Redis so far (one per non-empty call, plus one each
            for reloading the script after a server restart, failover or ``SCRIPT FLUSH``).

    Raises:
        ConfigurationError: ``window``, ``operation_timeout``, ``expected_ids`` or
            ``slot_groups`` is not positive. Raised by the first call instead: the group's
            ids are already spread for another ``expected_ids`` or ``slot_groups`` (the key
            ``prefix + group + ":layout"`` records them for three windows after the last
            call; every receiver of a group must use the same).
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
        slot_groups: int = DEFAULT_SLOT_GROUPS,
        read_legacy_keys: bool = True,
    ) -> None:
        self._window_ms = _milliseconds(positive_seconds(window, "window"))
        self._unit_ms = max(1, self._window_ms // UNITS_PER_WINDOW)
        self._operation_timeout = positive_seconds(operation_timeout, "operation_timeout")
        wanted = count(expected_ids, "expected_ids")
        self._hash_mask = (1 << max(0, math.ceil(math.log2(wanted / IDS_PER_HASH)))) - 1
        self._key_prefix = f"{prefix}{group}:".encode()
        self._groups = min(self._hash_mask + 1, count(slot_groups, "slot_groups", 1, 16_384))
        self._group_keys = [
            b"%s{%s}" % (self._key_prefix, _slot_tag(group, self._groups))
            for group in range(self._groups)
        ]
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
                # would only delay the StoreUnavailableError receivers pause on. No socket
                # timeout: every call runs under the operation_timeout deadline, whose
                # cancellation makes redis-py drop the connection, and redis-py's own
                # timeout would wrap each send in a task (a third of a commit's client CPU).
                timeouts["socket_timeout"] = None
                self._redis = redis.asyncio.Redis.from_url(
                    url_or_client, retry=Retry(NoBackoff(), 1), **timeouts
                )
        else:
            self._redis = url_or_client
        # A key per group: how its ids are spread. Every store of the group checks it, and
        # keeps it for three windows (its data's lifetime and more), once per bucket.
        self._layout = (
            self._key_prefix + b"layout",
            b"hashes=%d groups=%d" % (self._hash_mask + 1, self._groups),
        )
        self._layout_bucket: int | None = None
        self._cluster = isinstance(self._redis, RedisCluster)
        self._read_legacy = read_legacy_keys and not self._cluster
        self._sha: bytes = hashlib.sha1(_SCRIPT.encode()).hexdigest().encode()
        # Picks the time bucket only (the server's clock decides leases and windows); a
        # test sets it to play a receiver whose clock is off.
        self._wall_clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)
        self.round_trips = 0
        # What for_forked_child builds another store from: the URL and the settings.
        self._settings: tuple[str, dict[str, Any]] | None = None
        if isinstance(url_or_client, str):
            self._settings = (
                url_or_client,
                {
                    "group": group,
                    "prefix": prefix,
                    "window": window,
                    "operation_timeout": operation_timeout,
                    "cluster": cluster,
                    "expected_ids": expected_ids,
                    "slot_groups": slot_groups,
                    "read_legacy_keys": read_legacy_keys,
                },
            )

    def for_forked_child(self) -> RedisSeenSet | None:
        """Another store with this one's settings (the same keys: one seen-set) on a
        client of its own, for a process forked from the one that made this store, whose
        connections are the parent's; None if this store was given its client. The
        drop-in blocking client uses it to receive in such a child."""
        if self._settings is None:
            return None
        url, settings = self._settings
        return type(self)(url, **settings)

    @classmethod
    def from_url(cls, url: str, **options: Unpack[RedisSeenSetOptions]) -> RedisSeenSet:
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
            **options: The constructor's keyword arguments (``group``, ``prefix``,
                ``window``, ``operation_timeout``, ``cluster``, ``expected_ids``,
                ``slot_groups``, ``read_legacy_keys``), with its defaults.

        Raises:
            ConfigurationError: As the constructor.
        """
        return cls(url, **options)

    @property
    def window(self) -> float:
        """Seconds a committed key stays done."""
        return self._window_ms / 1000

    async def claim(self, keys: Sequence[str], *, owner: str, lease: float) -> list[ClaimState]:
        """Claim each key for ``owner`` for ``lease`` seconds; their states in key order.

        Raises:
            ConfigurationError: ``lease`` is not positive.
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

    async def _commit(
        self, keys: Sequence[str], owner: str, outcome: ClaimState, reasons: list[str]
    ) -> None:
        stored = _STORED[outcome]
        if outcome is ClaimState.DEAD_LETTERED:
            values = [stored + text.encode("utf-8", "replace") for text in reasons]
        else:
            values = [stored] * len(keys)
        await self._run(keys, _COMMIT, owner, 0, values)

    async def release(self, keys: Sequence[str], *, owner: str) -> None:
        """Drop ``owner``'s claims on the keys; done keys and others' claims stay."""
        await self._run(keys, _RELEASE, owner, 0)

    async def peek(self, keys: Sequence[str]) -> list[ClaimState | None]:
        """The keys' states without claiming them (None: no entry; IN_FLIGHT: claimed)."""
        return [_PEEKED[result] for result in await self._run(keys, _PEEK, "", 0)]

    async def extend(self, keys: Sequence[str], *, owner: str, lease: float) -> list[bool]:
        """Renew ``owner``'s claims for ``lease`` seconds; False where it no longer holds one.

        Raises:
            ConfigurationError: ``lease`` is not positive.
        """
        lease_ms = _milliseconds(positive_seconds(lease, "lease"))
        return [result == 1 for result in await self._run(keys, _EXTEND, owner, lease_ms)]

    async def get_session_state(self, key: str) -> bytes | None:
        """The session state stored under ``key`` (a GeoReceiver's scope and session id)."""
        value = await self._plain(self._redis.get, self._state_key(key))
        if value is None:
            return None
        return value if isinstance(value, bytes) else str(value).encode()

    async def set_session_state(self, key: str, state: bytes | None) -> None:
        """Store (None: delete) the session state under ``key``; it does not expire."""
        if state is None:
            await self._plain(self._redis.delete, self._state_key(key))
        else:
            await self._plain(self._redis.set, self._state_key(key), bytes(state))

    async def keep_schedules(
        self, scope: str, entries: Mapping[int, bytes], *, expires_at: float
    ) -> None:
        """Store each scheduled message's entry under ``scope`` until ``expires_at`` (epoch s)."""
        if not entries:
            return
        at = max(1, math.ceil(expires_at * 1000))

        async def write() -> None:
            async with self._redis.pipeline(transaction=False) as pipe:
                for number, value in entries.items():
                    pipe.set(self._schedule_key(scope, number), bytes(value), pxat=at)
                await pipe.execute()

        await self._plain(write)

    async def find_schedules(self, scope: str, numbers: Sequence[int]) -> list[bytes | None]:
        """The entries stored for ``numbers`` under ``scope`` (None: none, or expired)."""
        if not numbers:
            return []
        keys = [self._schedule_key(scope, number) for number in numbers]
        values = await self._plain(self._redis.mget, keys)
        return [
            None if v is None else v if isinstance(v, bytes) else str(v).encode() for v in values
        ]

    async def drop_schedules(self, scope: str, numbers: Sequence[int]) -> None:
        """Forget the entries of ``numbers`` under ``scope``."""
        if numbers:
            await self._plain(
                self._redis.delete, *(self._schedule_key(scope, number) for number in numbers)
            )

    def _schedule_key(self, scope: str, number: int) -> bytes:
        # One hash tag per scope: a scope's keys share a cluster slot (MGET, DEL in one call).
        return b"%ssched:{%s}:%d" % (
            self._key_prefix,
            _digest(scope.encode()).hex().encode(),
            number,
        )

    def _state_key(self, key: str) -> bytes:
        # One plain key per session (any slot on a cluster), beside the seen-set's hashes.
        return self._key_prefix + b"state:" + _digest(key.encode())

    async def _plain(self, command: Any, *args: Any) -> Any:
        self._check_open()
        self.round_trips += 1
        deadline = asyncio.timeout(self._operation_timeout)
        try:
            async with deadline:
                return await command(*args)
        except _STORE_ERRORS as exc:
            raise self._unavailable(exc, deadline_passed=deadline.expired()) from exc

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
        """Run the script for the keys (on a cluster once per slot group they fall in, all
        in one pipeline); the script's answers in key order.

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
        """The script calls for a batch, each with its keys' positions and the EVALSHA
        arguments: on a single Redis one call, naming every slot group; on a cluster one
        per slot group in the batch. Arguments go pre-encoded: redis-py would otherwise
        encode each one."""
        digests = [_digest(key.encode()) for key in keys]
        bucket = self._wall_clock_ms() // self._window_ms
        header = b"%s %d %d %d %d %d" % (
            operation.encode(),
            ms,
            self._window_ms,
            bucket * self._window_ms,
            self._unit_ms,
            self._hash_mask + 1,
        )
        legacy = self._key_prefix if self._read_legacy and operation in (_CLAIM, _PEEK) else b""
        common = [header, owner.encode(), legacy]
        if not self._cluster:
            # One script call for the batch (one per group cost the client about three
            # times the CPU): the script finds each id's group among the keys.
            arguments = [
                self._sha,
                b"%d" % self._groups,
                *self._group_keys,
                *common,
                *digests,
                *outcomes,
            ]
            return [(list(range(len(keys))), arguments)]
        by_group: dict[int, list[int]] = {}
        for position, digest in enumerate(digests):
            group = (int.from_bytes(digest[:4], "big") & self._hash_mask) % self._groups
            by_group.setdefault(group, []).append(position)
        calls = []
        for group, positions in by_group.items():
            arguments = [
                self._sha,
                b"1",
                self._group_keys[group],
                *common,
                *(digests[p] for p in positions),
                *(outcomes[p] for p in positions if outcomes),
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
        # nodes at once; a pipeline that met a pooled connection a node dropped (a master
        # restarted since) is sent once more on new ones, like the single server's client
        # does (each operation is idempotent for its owner: a rerun changes nothing more).
        reloaded = resent = False
        for attempt in range(3):
            bucket = self._wall_clock_ms() // self._window_ms
            check_layout = attempt == 0 and bucket != self._layout_bucket
            if len(pending) == 1 and not check_layout and not self._cluster:
                # One call (a single key's commit, the usual batch on one Redis): sent as
                # it is, without a pipeline's objects (a third of the call's client CPU).
                self.round_trips += 1
                try:
                    results[pending[0]] = await self._redis.execute_command(
                        "EVALSHA", *calls[pending[0]]
                    )
                    break
                except NoScriptError:
                    if reloaded:
                        raise
                reloaded = True
                self.round_trips += 1
                await self._redis.script_load(_SCRIPT)
                continue
            pipe = self._redis.pipeline(transaction=False)
            if check_layout:  # SET NX, then GET: SET's NX and GET go together on 7.0+ only
                pipe.set(*self._layout, nx=True, px=3 * self._window_ms)
                pipe.get(self._layout[0])
                pipe.pexpire(self._layout[0], 3 * self._window_ms)
            for index in pending:
                pipe.execute_command("EVALSHA", *calls[index])
            self.round_trips += 1
            answers = await pipe.execute(raise_on_error=False)
            if (
                self._cluster
                and not resent
                and any(isinstance(answer, RedisConnectionError) for answer in answers)
            ):
                resent = True  # the whole pipeline once more, layout check and all
                continue
            if check_layout:
                self._check_layout(answers[1])
                self._layout_bucket = bucket
                answers = answers[3:]
            missing: list[int] = []
            for index, answer in zip(pending, answers, strict=True):
                if isinstance(answer, NoScriptError) and not reloaded:
                    missing.append(index)
                elif isinstance(answer, Exception):
                    raise answer
                else:
                    results[index] = answer
            if not missing:
                break
            reloaded = True
            self.round_trips += 1
            await self._redis.script_load(_SCRIPT)  # on a cluster: on every master
            pending = missing
        return results

    def _check_layout(self, recorded: Any) -> None:
        """The group's recorded layout (how many hashes and slot groups its ids are spread
        over) must be this store's: a store sized otherwise would look for the group's ids
        in other keys, and must not run."""
        if isinstance(recorded, Exception):
            raise recorded
        theirs = recorded.decode() if isinstance(recorded, bytes) else recorded
        ours = self._layout[1].decode()
        if theirs is not None and theirs != ours:
            key = self._layout[0].decode("utf-8", "replace")
            raise ConfigurationError(
                f"seen set: the group's ids are spread over {theirs} (key {key!r}), this "
                f"store's over {ours}: give every receiver of the group the same "
                "expected_ids and slot_groups (to change them, stop them all and delete "
                "that key)"
            )

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
