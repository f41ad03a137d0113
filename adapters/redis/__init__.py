"""Where georep meets Redis: the shared seen-set of the dedup receiver (SPEC §2.4).

Install with ``pip install 'georep[redis]'``.
"""

from __future__ import annotations

try:
    import redis  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("georep.adapters.redis needs redis: pip install 'georep[redis]'") from exc

from ._embedded import embedded_redis_url
from ._seen import RedisSeenSet

__all__ = ["RedisSeenSet", "embedded_redis_url"]
