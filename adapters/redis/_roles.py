"""The shared role store on Redis: one hash per application and entity, changed by Lua.

The record of ``entity`` in application ``app`` is the hash ``georep:roles:{app}:entity``
(fields ``active``, ``generation``, ``since``, ``pinned``, ``automatic``, ``changed_by``,
``mode``), and the set ``georep:roles:{app}`` lists the entities. The braces are a Redis
Cluster hash tag: one application's keys share a slot, so each script may touch two of
them. A change is one script run, a compare-and-set on the generation, atomic in Redis.
Failure reports (``Corroboration(reports=N)``) are one sorted set per entity, region and
generation, ``georep:roles:{app}:entity:failing:region:generation`` (member: the process,
score: when it reported), which expires a second after its window.
"""

from __future__ import annotations

__all__ = ["RedisRoleStore"]

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Final

import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import (
    ConnectionError as RedisConnectionError,
    RedisError,
    TimeoutError as RedisTimeoutError,
)

from georep._lifecycle import AsyncResource
from georep._policy import positive_seconds
from georep.exceptions import ConfigurationError, StoreUnavailableError
from georep.ports import NO_RECORD, RoleChangeTerms, RoleRecord
from georep.roles.store import DEFAULT_REFRESH_INTERVAL

DEFAULT_OPERATION_TIMEOUT: Final = 0.5

_FIELDS: Final = ("active", "generation", "since", "pinned", "automatic", "changed_by", "mode")

# Both scripts answer {flag, the seven fields}; flag 1 when the script wrote the record. A
# record written before the mode was kept has no 'mode' field: it answers nil (mode '').
_CREATE: Final = """
local found = redis.call('HMGET', KEYS[1], 'active', 'generation', 'since', 'pinned',
  'automatic', 'changed_by', 'mode')
if found[1] then
  return {0, found[1], found[2], found[3], found[4], found[5], found[6], found[7]}
end
redis.call('HSET', KEYS[1], 'active', ARGV[1], 'generation', ARGV[2], 'since', ARGV[3],
  'pinned', ARGV[4], 'automatic', ARGV[5], 'changed_by', ARGV[6], 'mode', ARGV[7])
redis.call('SADD', KEYS[2], ARGV[8])
return {1, ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]}
"""

# ARGV: expected generation, active, changed_by, now, automatic ('1'/'0'), pinned ('1',
# '0', or '' to keep it).
_CHANGE: Final = """
local h = redis.call('HMGET', KEYS[1], 'active', 'generation', 'since', 'pinned',
  'automatic', 'changed_by', 'mode')
if not h[1] then
  return {0}
end
if h[2] ~= ARGV[1] or (ARGV[5] == '1' and h[4] == '1') then
  return {0, h[1], h[2], h[3], h[4], h[5], h[6], h[7]}
end
local generation, since, automatic = h[2], h[3], h[5]
if h[1] ~= ARGV[2] then
  generation = tostring(tonumber(h[2]) + 1)
  since = ARGV[4]
  automatic = ARGV[5]
end
local pinned = h[4]
if ARGV[6] ~= '' then
  pinned = ARGV[6]
end
redis.call('HSET', KEYS[1], 'active', ARGV[2], 'generation', generation, 'since', since,
  'pinned', pinned, 'automatic', automatic, 'changed_by', ARGV[3])
return {1, ARGV[2], generation, since, pinned, automatic, ARGV[3], h[7]}
"""

# The record and its name in the index go together.
_DELETE: Final = """
local removed = redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
return removed
"""


# KEYS[1] the reports; ARGV: reporter, now, window (seconds). Answers the reporters left.
_REPORT: Final = """
local now, window = tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
redis.call('PEXPIRE', KEYS[1], math.ceil(window * 1000) + 1000)
return redis.call('ZCARD', KEYS[1])
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _record(fields: list[Any]) -> RoleRecord:
    active, generation, since, pinned, automatic, changed_by = (_text(f) for f in fields[:6])
    mode = fields[6] if len(fields) > 6 else None
    return RoleRecord(
        active=active,
        generation=int(generation),
        since=float(since),
        pinned=pinned == "1",
        automatic=automatic == "1",
        changed_by=changed_by,
        mode="" if mode is None else _text(mode),
    )


def _flag(value: bool) -> str:
    return "1" if value else "0"


class RedisRoleStore(AsyncResource):
    """A :class:`georep.ports.RoleStore` on Redis, shared by every process of ``app``.

    Build it with :meth:`from_url` (the store creates its client and closes it), or give
    the constructor a ``redis.asyncio.Redis`` client (borrowed, never closed by the store).

    Args:
        url_or_client: A ``redis.asyncio.Redis`` client (borrowed) or a URL (owned).
        app: The application's name: its processes share roles, other applications'
            do not. Letters, digits, ``-``, ``_`` and ``.``.
        refresh_interval: Seconds between two background reads of a record by each
            process (how soon every process follows a change). Default 0.25.
        operation_timeout: Most seconds one call may take, reconnect included. Default 0.5.

    Raises:
        ConfigurationError: ``app`` is empty or has other characters, or a duration is
            not positive.
    """

    def __init__(
        self,
        url_or_client: str | redis.asyncio.Redis,
        *,
        app: str,
        refresh_interval: float = DEFAULT_REFRESH_INTERVAL,
        operation_timeout: float = DEFAULT_OPERATION_TIMEOUT,
    ) -> None:
        if not app or not all(c.isalnum() or c in "-_." for c in app):
            raise ConfigurationError(
                f"app {app!r} must be a non-empty name of letters, digits, '-', '_' or '.'"
            )
        self.app = app
        self.refresh_interval = positive_seconds(refresh_interval, "refresh_interval")
        self.operation_timeout = positive_seconds(operation_timeout, "operation_timeout")
        self._owns_client = isinstance(url_or_client, str)
        if isinstance(url_or_client, str):
            self._redis: redis.asyncio.Redis = redis.asyncio.Redis.from_url(
                url_or_client,
                socket_timeout=self.operation_timeout,
                socket_connect_timeout=self.operation_timeout,
                retry=Retry(NoBackoff(), 1),
            )
        else:
            self._redis = url_or_client
        self._index = f"georep:roles:{{{app}}}"
        self._create_script = self._redis.register_script(_CREATE)
        self._change_script = self._redis.register_script(_CHANGE)
        self._delete_script = self._redis.register_script(_DELETE)
        self._report_script = self._redis.register_script(_REPORT)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        app: str,
        refresh_interval: float = DEFAULT_REFRESH_INTERVAL,
        operation_timeout: float = DEFAULT_OPERATION_TIMEOUT,
    ) -> RedisRoleStore:
        """A store on its own client for ``url`` (closed by :meth:`aclose`)."""
        return cls(
            url,
            app=app,
            refresh_interval=refresh_interval,
            operation_timeout=operation_timeout,
        )

    @property
    def client(self) -> redis.asyncio.Redis:
        """The Redis client (``georep status`` counts seen-set keys with it)."""
        return self._redis

    def key(self, entity: str) -> str:
        """The hash that holds ``entity``'s record."""
        return f"{self._index}:{entity}"

    async def read(self, entity: str) -> RoleRecord | None:
        fields = await self._call(lambda: self._redis.hmget(self.key(entity), _FIELDS))
        return None if fields[0] is None else _record(fields)

    async def create(self, entity: str, record: RoleRecord) -> RoleRecord:
        args = [
            record.active,
            str(record.generation),
            repr(record.since),
            _flag(record.pinned),
            _flag(record.automatic),
            record.changed_by,
            record.mode,
            entity,
        ]
        answer = await self._call(
            lambda: self._create_script(keys=[self.key(entity), self._index], args=args)
        )
        return _record(answer[1:])

    async def change(self, entity: str, terms: RoleChangeTerms) -> tuple[bool, RoleRecord]:
        args = [
            str(terms.expected_generation),
            terms.active,
            terms.changed_by,
            repr(terms.now),
            _flag(terms.automatic),
            "" if terms.pinned is None else _flag(terms.pinned),
        ]
        answer = await self._call(lambda: self._change_script(keys=[self.key(entity)], args=args))
        if len(answer) == 1:
            return False, NO_RECORD
        return answer[0] == 1, _record(answer[1:])

    async def entities(self) -> list[str]:
        members = await self._call(lambda: self._redis.smembers(self._index))
        return sorted(_text(member) for member in members)

    async def delete(self, entity: str) -> bool:
        removed = await self._call(
            lambda: self._delete_script(keys=[self.key(entity), self._index], args=[entity])
        )
        return bool(removed)

    async def report_failure(
        self, entity: str, *, region: str, generation: int, reporter: str, now: float, window: float
    ) -> int:
        key = f"{self.key(entity)}:failing:{region}:{generation}"
        args = [reporter, repr(now), repr(window)]
        answer = await self._call(lambda: self._report_script(keys=[key], args=args))
        return int(answer)

    async def aclose(self) -> None:
        """Close the client if the store created it; idempotent and shielded."""
        await super().aclose()

    async def _close(self) -> None:
        if self._owns_client:
            await self._redis.aclose()

    async def _call(self, call: Callable[[], Awaitable[Any]]) -> Any:
        self._check_open()
        try:
            async with asyncio.timeout(self.operation_timeout):
                return await call()
        except (RedisError, OSError) as exc:  # OSError includes TimeoutError
            raise self._unavailable(exc) from exc

    def _unavailable(self, exc: BaseException) -> StoreUnavailableError:
        """The one translation of a Redis failure; the password never reaches the text."""
        connection: dict[str, Any] = self._redis.connection_pool.connection_kwargs
        where = connection.get("path") or (
            f"{connection.get('host', 'localhost')}:{connection.get('port', 6379)}"
        )
        description = str(exc) or type(exc).__name__
        password = connection.get("password")
        if password:
            description = description.replace(str(password), "***")
        if isinstance(exc, TimeoutError | RedisTimeoutError):
            detail = f"did not answer within {self.operation_timeout:g} s"
        elif isinstance(exc, OSError | RedisConnectionError):
            detail = f"cannot be reached ({type(exc).__name__}: {description})"
        else:
            detail = f"refused the call ({type(exc).__name__}: {description})"
        return StoreUnavailableError(f"role store: redis at {where} {detail}")
