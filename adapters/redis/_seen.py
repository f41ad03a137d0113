"""The seen-set on Redis: one string key per dedup key, one Lua script for every operation.

A key (the prefix, the group and a 128-bit digest of the dedup key) holds ``"1"`` once its
message was processed, ``"F"`` once deferred, ``"D" + reason`` once dead-lettered (TTL = the
dedup window), or ``"c" + owner`` while a consumer holds a claim on it (TTL = the lease).
Every script call touches exactly one key (``KEYS[1]``), so the store works unchanged on
Redis Cluster (SPEC §2.4); a method sends one call per key, all in one pipeline: one round
trip however many keys it is given.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Final

import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from georep._lifecycle import AsyncResource
from georep._outcomes import check_commit
from georep._policy import positive_seconds
from georep.exceptions import StoreUnavailableError
from georep.ports import Claims, ClaimState

__all__ = ["RedisSeenSet"]

DEFAULT_WINDOW: Final = timedelta(hours=24)
DEFAULT_OPERATION_TIMEOUT: Final = 2.0

# Values: '1' done (an integer Redis can share between keys instead of storing one per key,
# under the noeviction policy the seen-set needs anyway), 'c' .. owner claimed, 'F' deferred,
# 'D' .. reason dead-lettered (the reason is returned to the twin's claim).
# ARGV: operation, owner, milliseconds (the lease for claim/extend, the window for commit),
# and for commit the value to store.
# Returns for claim: 0 claimed, 1 in flight, 2 done, 4 deferred, or the stored 'D' .. reason
# string for dead-lettered; for peek the same numbers, 3 dead-lettered and 5 no entry; for
# the others 1 if it changed the key.
# The operation names are one letter: the script runs once per key, 1,000s of times a batch.
_SCRIPT: Final = """
local op = ARGV[1]
if op == 'm' then
  redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[3])
  return 1
end
local value = redis.call('GET', KEYS[1])
if op == 'p' then
  if not value then
    return 5
  end
  if value == '1' then
    return 2
  end
  if value == 'F' then
    return 4
  end
  if string.sub(value, 1, 1) == 'D' then
    return 3
  end
  return 1
end
local mine = 'c' .. ARGV[2]
if op == 'c' then
  if not value then
    redis.call('SET', KEYS[1], mine, 'PX', ARGV[3])
    return 0
  end
  if value == '1' then
    return 2
  end
  if value == mine then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return 0
  end
  if value == 'F' then
    return 4
  end
  if string.sub(value, 1, 1) == 'D' then
    return value
  end
  return 1
end
if value ~= mine then
  return 0
end
if op == 'r' then
  redis.call('DEL', KEYS[1])
  return 1
end
if op == 'e' then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
return redis.error_reply('georep seen-set: unknown operation ' .. tostring(op))
"""

_CLAIM, _COMMIT, _RELEASE, _EXTEND, _PEEK = "c", "m", "r", "e", "p"


def _digest(data: bytes) -> Any:
    return hashlib.blake2b(data, digest_size=16)


_CLAIM_STATES: Final = {
    0: ClaimState.CLAIMED,
    1: ClaimState.IN_FLIGHT,
    2: ClaimState.DONE,
    4: ClaimState.DEFERRED,
}
_PEEKED: Final = {**_CLAIM_STATES, 3: ClaimState.DEAD_LETTERED, 5: None}
_STORED: Final = {ClaimState.DONE: b"1", ClaimState.DEFERRED: b"F", ClaimState.DEAD_LETTERED: b"D"}


def _milliseconds(value: float) -> int:
    # PX takes whole milliseconds; round up so a tiny lease is never 0 (which Redis refuses).
    return max(1, math.ceil(value * 1000))


class RedisSeenSet(AsyncResource):
    """A :class:`georep.ports.SeenStore` on Redis, shared by every receiver process.

    Build it with :meth:`from_url` (the store creates its client and closes it), or give
    the constructor a ``redis.asyncio.Redis`` client (borrowed: used as configured, never
    closed by the store), as redis-py's ``from_url`` versus its constructor.

    Args:
        url_or_client: A ``redis.asyncio.Redis`` client (borrowed), or a URL (as
            :meth:`from_url`: the store owns the client it creates).
        group: Receivers that deduplicate against each other share a group. Default
            ``"default"``.
        prefix: Prepended to every key: ``f"{prefix}{group}:{key}"``. Default
            ``"georep:seen:"``.
        window: How long a processed key stays done, in seconds or a ``timedelta``.
            Default 24 hours. A copy arriving later than this is processed again.
        operation_timeout: Most seconds one call may take, retries and reconnects
            included. Default 2.0.

    Attributes:
        round_trips: Exchanges with Redis so far (one per non-empty call, plus one each
            for reloading the script after a server restart or ``SCRIPT FLUSH``).

    Raises:
        ConfigurationError: ``window`` or ``operation_timeout`` is not positive.
    """

    def __init__(
        self,
        url_or_client: str | redis.asyncio.Redis,
        *,
        group: str = "default",
        prefix: str = "georep:seen:",
        window: float | timedelta = DEFAULT_WINDOW,
        operation_timeout: float = DEFAULT_OPERATION_TIMEOUT,
    ) -> None:
        self._window_ms = _milliseconds(positive_seconds(window, "window"))
        self._operation_timeout = positive_seconds(operation_timeout, "operation_timeout")
        # Keys are the prefix and a 128-bit BLAKE2b digest of the id, in binary: 16 bytes
        # instead of 36+ characters keeps a done id at about 130 bytes of Redis memory
        # (measured by benchmarks/redis_memory.py; the target is 150).
        self._key_prefix = f"{prefix}{group}:".encode()
        self._owns_client = isinstance(url_or_client, str)
        if isinstance(url_or_client, str):
            self._redis: redis.asyncio.Redis = redis.asyncio.Redis.from_url(
                url_or_client,
                socket_timeout=self._operation_timeout,
                socket_connect_timeout=self._operation_timeout,
                # One quick reconnect covers a pooled connection the server dropped; more
                # would only delay the StoreUnavailableError receivers pause on.
                retry=Retry(NoBackoff(), 1),
            )
        else:
            self._redis = url_or_client
        self._script = self._redis.register_script(_SCRIPT)
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
    ) -> RedisSeenSet:
        """A store on its own client for ``url``, closed by :meth:`aclose`.

        The client takes ``operation_timeout`` as socket and connect timeout and makes one
        immediate reconnect, no backoff (a longer wait would only delay the
        StoreUnavailableError receivers pause on).

        Args:
            url: A ``redis://``, ``rediss://`` or ``unix://`` URL.
            group: As the constructor.
            prefix: As the constructor.
            window: As the constructor.
            operation_timeout: As the constructor.

        Raises:
            ConfigurationError: ``window`` or ``operation_timeout`` is not positive.
        """
        return cls(
            url, group=group, prefix=prefix, window=window, operation_timeout=operation_timeout
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
        await self._run(keys, _COMMIT, owner, self._window_ms, values)

    async def release(self, keys: Sequence[str], *, owner: str) -> None:
        """Drop ``owner``'s claims on the keys; done keys and others' claims stay.

        Raises:
            StoreUnavailableError: Redis did not answer in time or refused the call.
            ClosedError: The store was closed.
        """
        await self._run(keys, _RELEASE, owner, 0)

    async def peek(self, keys: Sequence[str]) -> list[ClaimState | None]:
        """The keys' states without claiming them (None: no entry; IN_FLIGHT: claimed).

        Raises:
            StoreUnavailableError: Redis did not answer in time or refused the call.
            ClosedError: The store was closed.
        """
        return [_PEEKED[result] for result in await self._run(keys, _PEEK, "", 0)]

    async def extend(self, keys: Sequence[str], *, owner: str, lease: float) -> list[bool]:
        """Renew ``owner``'s claims for ``lease`` seconds; False where it no longer holds one.

        Raises:
            ConfigurationError: ``lease`` is not positive.
            StoreUnavailableError: Redis did not answer in time or refused the call.
            ClosedError: The store was closed.
        """
        lease_ms = _milliseconds(positive_seconds(lease, "lease"))
        return [result == 1 for result in await self._run(keys, _EXTEND, owner, lease_ms)]

    async def get_session_state(self, key: str) -> bytes | None:
        """The session state stored under ``key`` (a GeoReceiver's scope and session id).

        Raises:
            StoreUnavailableError: Redis did not answer in time or refused the call.
            ClosedError: The store was closed.
        """
        value = await self._plain(self._redis.get, self._state_key(key))
        if value is None:
            return None
        return value if isinstance(value, bytes) else str(value).encode()

    async def set_session_state(self, key: str, state: bytes | None) -> None:
        """Store (None: delete) the session state under ``key``; it does not expire.

        Raises:
            StoreUnavailableError: Redis did not answer in time or refused the call.
            ClosedError: The store was closed.
        """
        if state is None:
            await self._plain(self._redis.delete, self._state_key(key))
        else:
            await self._plain(self._redis.set, self._state_key(key), bytes(state))

    def _state_key(self, key: str) -> bytes:
        # Beside the seen-set's digests (16 bytes after the prefix), never one of them.
        digest: bytes = _digest(key.encode()).digest()
        return self._key_prefix + b"state:" + digest

    async def _plain(self, command: Any, *args: Any) -> Any:
        self._check_open()
        self.round_trips += 1
        deadline = asyncio.timeout(self._operation_timeout)
        try:
            async with deadline:
                return await command(*args)
        except (RedisError, OSError) as exc:
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
        values: Sequence[bytes] | None = None,
    ) -> list[Any]:
        """Run the script once per key, all in one pipeline; the script's answers in order.

        ``values`` (commit only) is one more argument per key: the value to store.
        """
        self._check_open()
        if not keys:
            return []
        prefix = self._key_prefix
        full_keys = [prefix + _digest(key.encode()).digest() for key in keys]
        deadline = asyncio.timeout(self._operation_timeout)
        try:
            async with deadline:
                # Arguments go pre-encoded: redis-py encodes every argument of every call
                # otherwise, a cost paid per key per batch.
                args = (operation.encode(), owner.encode(), str(ms).encode())
                return await self._pipelined(full_keys, args, values)
        except (RedisError, OSError) as exc:  # OSError includes TimeoutError
            raise self._unavailable(exc, deadline_passed=deadline.expired()) from exc

    async def _pipelined(
        self,
        full_keys: list[bytes],
        args: tuple[bytes, bytes, bytes],
        values: Sequence[bytes] | None,
    ) -> list[Any]:
        results: list[Any] = [None] * len(full_keys)
        pending = list(range(len(full_keys)))
        # EVALSHA straight into the pipeline: redis-py's Script object would add a
        # SCRIPT EXISTS round trip to every pipeline. A NOSCRIPT answer (new or restarted
        # server, SCRIPT FLUSH) loads the script and reruns only the calls that got it.
        for attempt in range(2):
            pipe = self._redis.pipeline(transaction=False)
            sha = (
                self._script.sha.encode() if isinstance(self._script.sha, str) else self._script.sha
            )
            for index in pending:
                extra = () if values is None else (values[index],)
                pipe.execute_command("EVALSHA", sha, b"1", full_keys[index], *args, *extra)
            self.round_trips += 1
            answers = await pipe.execute(raise_on_error=False)
            missing: list[int] = []
            for index, answer in zip(pending, answers, strict=True):
                if isinstance(answer, NoScriptError) and attempt == 0:
                    missing.append(index)
                elif isinstance(answer, Exception):
                    raise answer
                else:
                    # Integers, or a dead-lettered key's stored value (bytes, or str on a
                    # client created with decode_responses=True).
                    results[index] = answer
            if not missing:
                break
            self.round_trips += 1
            self._script.sha = await self._redis.script_load(_SCRIPT)
            pending = missing
        return results

    def _unavailable(
        self, exc: BaseException, *, deadline_passed: bool = False
    ) -> StoreUnavailableError:
        """The one translation of a Redis client or socket failure into a georep error.

        The text names the server (host:port or socket path) and carries the client's own
        description, with the password scrubbed should it ever appear there.
        """
        connection: dict[str, Any] = self._redis.connection_pool.connection_kwargs
        if connection.get("path"):
            where = f"redis at unix:{connection['path']}"
        else:
            where = f"redis at {connection.get('host', 'localhost')}:{connection.get('port', 6379)}"
        description = str(exc) or type(exc).__name__
        password = connection.get("password")
        if password:
            description = description.replace(str(password), "***")
        if deadline_passed:
            detail = f"did not answer within {self._operation_timeout:g} s"
        elif isinstance(exc, RedisTimeoutError | TimeoutError):
            detail = f"did not answer in time ({type(exc).__name__}: {description})"
        elif isinstance(exc, RedisConnectionError | OSError):
            detail = f"cannot be reached ({type(exc).__name__}: {description})"
        else:
            detail = f"refused the seen-set call ({type(exc).__name__}: {description})"
        return StoreUnavailableError(f"seen set: {where} {detail}")
