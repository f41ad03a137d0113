"""Where georep meets Redis: the receivers' seen-set (SPEC §2.4) and the shared roles.

Install with ``pip install 'georep[redis]'``.
"""

from __future__ import annotations

__all__ = [
    "PrivateRedisCluster",
    "RedisRoleStore",
    "RedisSeenSet",
    "embedded_redis_url",
    "private_redis_cluster",
    "private_redis_server",
]

from georep._extras import require_extra

require_extra("georep.adapters.redis", "redis", "redis")

from ._embedded import (
    PrivateRedisCluster,
    embedded_redis_url,
    private_redis_cluster,
    private_redis_server,
)
from ._roles import RedisRoleStore
from ._seen import RedisSeenSet
