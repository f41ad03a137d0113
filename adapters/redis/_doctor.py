"""``georep doctor``'s Redis check: reachable, ids never evicted, and ids kept over a restart."""

from __future__ import annotations

__all__ = ["check_seen_set_redis"]

from typing import Any

import redis.asyncio
from redis.exceptions import RedisError, ResponseError

from georep._doctor import Finding
from georep._lifecycle import wait_within

_SAFE_POLICY = "noeviction"


def _where(client: redis.asyncio.Redis) -> str:
    connection: dict[str, Any] = client.connection_pool.connection_kwargs
    if connection.get("path"):
        return f"unix:{connection['path']}"
    return f"{connection.get('host', 'localhost')}:{connection.get('port', 6379)}"


async def _config(client: redis.asyncio.Redis, name: str) -> str | None:
    """A CONFIG value, or None where CONFIG is disabled (managed Redis services)."""
    try:
        answer: dict[Any, Any] = await client.config_get(name)
    except ResponseError:
        return None
    value = answer.get(name, answer.get(name.encode()))
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


async def _policy(client: redis.asyncio.Redis) -> str:
    """The eviction policy; through INFO where CONFIG is disabled (managed Redis services)."""
    value = await _config(client, "maxmemory-policy")
    if value:
        return value
    info = await client.info("memory")
    return str(info.get("maxmemory_policy", "unknown"))


_MANAGED_FIX = (
    "managed Redis: enable data persistence (Azure Cache for Redis: Premium tier or above, "
    "Data persistence = AOF or RDB), or use a tier that has it"
)
_FIX = f"appendonly yes (appendfsync everysec) and/or a save schedule (save 60 1); {_MANAGED_FIX}"


async def _persistence(client: redis.asyncio.Redis) -> Finding:
    """Whether the seen-set survives a Redis restart.

    With neither RDB snapshots nor the AOF, a restart empties the seen-set: every copy
    still in a queue is then processed a second time (144 of 300 in one test run).
    """
    appendonly = await _config(client, "appendonly")
    save = await _config(client, "save")
    if appendonly is None:  # CONFIG disabled: INFO shows the AOF, not the RDB schedule
        info = await client.info("persistence")
        if str(info.get("aof_enabled", "0")) == "1":
            return Finding.ok("redis", "AOF persistence on: the seen-set survives a restart")
        return Finding.warning(
            "redis",
            "AOF persistence is off and RDB snapshots cannot be confirmed (CONFIG is "
            "disabled): if Redis restarts without persistence, the seen-set is empty and "
            "copies still queued are processed a second time",
            _MANAGED_FIX,
        )
    if appendonly == "yes":
        return Finding.ok("redis", "appendonly yes: the seen-set survives a restart")
    if save and save.strip():
        return Finding.ok(
            "redis",
            f"RDB snapshots (save {save}): a restart loses only the ids claimed since the "
            "last snapshot; appendonly yes narrows that to about a second",
        )
    return Finding.warning(
        "redis",
        "persistence is off (no RDB save schedule, appendonly no): a Redis restart empties "
        "the seen-set, and every copy still queued is then processed a second time",
        _FIX,
    )


async def check_seen_set_redis(url: str, *, timeout: float = 5.0) -> list[Finding]:
    """Check the Redis deployment the receivers' seen-set will use.

    A policy other than ``noeviction`` lets Redis drop ids under memory pressure: every seen-set
    key has a TTL, so even the ``volatile-*`` policies pick them, and a dropped id means a
    duplicate processed twice. A Redis with neither RDB snapshots nor the AOF forgets every
    id when it restarts: a warning, with the fix (through ``CONFIG GET``, or ``INFO
    persistence`` where a managed service disables CONFIG).

    Returns:
        Findings; the password never appears in them.
    """
    try:
        client = redis.asyncio.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout
        )
    except ValueError as exc:
        scheme = url.split("://", 1)[0] if "://" in url else "(none)"
        return [
            Finding.problem(
                "redis",
                f"the Redis URL is malformed (scheme {scheme}; {type(exc).__name__})",
                "use redis://[:password@]host:port/db, rediss:// for TLS, or unix:///path",
            )
        ]
    where = _where(client)
    try:
        await wait_within(client.ping(), timeout)
        cluster = await wait_within(client.info("cluster"), timeout)
        if str(cluster.get("cluster_enabled", "0")) == "1":
            return await _check_cluster(client, where, timeout)
        return await _check_node(client, where, timeout)
    except (RedisError, OSError, TimeoutError) as exc:
        return [_unusable(where, exc)]
    finally:
        await client.aclose()


def _unusable(where: str, exc: BaseException) -> Finding:
    return Finding.problem(
        "redis",
        f"{where} cannot be used ({type(exc).__name__})",
        "start Redis, or point --redis-url / $REDIS_URL at it (check host, port, password and TLS)",
    )


async def _check_node(client: redis.asyncio.Redis, where: str, timeout: float) -> list[Finding]:
    """One Redis (or one master of a cluster): version, eviction policy, persistence."""
    policy = await wait_within(_policy(client), timeout)
    info = await wait_within(client.info("server"), timeout)
    persistence = await wait_within(_persistence(client), timeout)
    findings = [Finding.ok("redis", f"{where} answers (Redis {info.get('redis_version')})")]
    if policy == _SAFE_POLICY:
        findings.append(Finding.ok("redis", "maxmemory-policy noeviction: ids are never evicted"))
    else:
        findings.append(
            Finding.problem(
                "redis",
                f"maxmemory-policy is {policy} on {where}: under memory pressure Redis may "
                "evict seen-set ids, and a duplicate would then be processed twice",
                "CONFIG SET maxmemory-policy noeviction (Azure Cache for Redis: set "
                "maxmemory-policy to noeviction under Advanced settings), and size memory "
                "for bytes per id x ids per second x window",
            )
        )
    findings.append(persistence)
    return findings


async def _check_cluster(client: redis.asyncio.Redis, where: str, timeout: float) -> list[Finding]:
    """A Redis Cluster (the node of the URL says ``cluster_enabled``): its state, and each
    master that owns slots checked as a single Redis (the seen-set's keys live there)."""
    state = await wait_within(client.execute_command("CLUSTER INFO"), timeout)  # type: ignore[no-untyped-call]
    if isinstance(state, dict):  # redis-py parses the answer into its fields
        fields = {_text(k): _text(v) for k, v in state.items()}
    else:
        lines = _text(state).splitlines()
        fields = dict(line.split(":", 1) for line in lines if ":" in line)
    findings: list[Finding] = []
    if fields.get("cluster_state", "").strip() == "ok":
        findings.append(
            Finding.ok(
                "redis",
                f"{where} is a node of a Redis Cluster in state ok "
                f"({fields.get('cluster_size', '?').strip()} masters own the slots): "
                "use RedisSeenSet.from_url(url, cluster=True)",
            )
        )
    else:
        findings.append(
            Finding.problem(
                "redis",
                f"the Redis Cluster of {where} is in state "
                f"{fields.get('cluster_state', 'unknown').strip()}: some slots have no "
                "master, and the receivers pause on the ids that hash there",
                "bring the failed masters back or fail their replicas over "
                "(redis-cli --cluster check / fix)",
            )
        )
    slots = await wait_within(client.execute_command("CLUSTER SLOTS"), timeout)  # type: ignore[no-untyped-call]
    masters = sorted({(_text(entry[2][0]), int(entry[2][1])) for entry in slots})
    connection = client.connection_pool.connection_kwargs
    for host, port in masters:
        node = redis.asyncio.Redis(
            host=host or connection.get("host", "127.0.0.1"),
            port=port,
            password=connection.get("password"),
            username=connection.get("username"),
            ssl=bool(connection.get("ssl", False)),
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
        )
        label = f"{host}:{port}"
        try:
            await wait_within(node.ping(), timeout)
            findings += await _check_node(node, f"cluster master {label}", timeout)
        except (RedisError, OSError, TimeoutError) as exc:
            findings.append(_unusable(f"cluster master {label}", exc))
        finally:
            await node.aclose()
    return findings


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
