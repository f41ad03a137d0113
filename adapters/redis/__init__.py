"""Where georep meets Redis: the shared seen-set of the dedup receiver (SPEC §2.4).

Install with ``pip install 'georep[redis]'``.
"""

from __future__ import annotations

from georep._extras import require_extra

require_extra("georep.adapters.redis", "redis", "redis")

from ._embedded import (
    PrivateRedisCluster,
    embedded_redis_url,
    private_redis_cluster,
    private_redis_server,
)
from ._seen import RedisSeenSet

__all__ = [
    "PrivateRedisCluster",
    "RedisSeenSet",
    "embedded_redis_url",
    "private_redis_cluster",
    "private_redis_server",
]
