"""``list_queue_sessions`` / ``list_subscription_sessions`` over two regions: each region's
list, one entry per session."""

from __future__ import annotations

__all__ = ["sessions_in_both"]

import asyncio
import logging
from collections.abc import Sequence
from datetime import datetime

from georep._classify import every_region_refused
from georep.exceptions import AllRegionsUnavailableError, RegionError, RegionTimeoutError
from georep.ports import ErrorKind, RegionSessions

_log = logging.getLogger("georep.servicebus")


async def sessions_in_both(
    entities: Sequence[RegionSessions],
    *,
    state_updated_after: datetime | None,
    timeout: float | None,
) -> list[str]:
    """Every session id either region lists, once each: the primary's in its order, then
    those only the secondary has (a session is in both regions when active replication
    sent its messages to both).

    A region that fails is left out (logged); ``timeout`` bounds the whole call, as the
    SDK's bounds its every page.

    Raises:
        RegionError: Every region refused the client's own settings (its key, its entity,
            an entity without sessions): the primary's refusal, as the SDK raises it.
        AllRegionsUnavailableError: No region answered (a ``ServiceBusConnectionError``).
        RegionTimeoutError: No answer within ``timeout`` (the SDK's
            ``OperationTimeoutError``).
    """
    calls = [
        entity.list_sessions(state_updated_after=state_updated_after, timeout=timeout)
        for entity in entities
    ]
    try:
        async with asyncio.timeout(timeout):  # None: the regions' own deadlines only
            answers = await asyncio.gather(*calls, return_exceptions=True)
    except TimeoutError:
        raise _too_slow(entities, timeout) from None
    listed: dict[str, None] = {}
    errors: list[BaseException | None] = []
    for answer in answers:
        if isinstance(answer, BaseException):
            if not isinstance(answer, Exception):
                raise answer  # the caller's cancellation, or the interpreter's exit
            errors.append(answer)
            continue
        errors.append(None)
        listed.update(dict.fromkeys(answer))
    if any(error is None for error in errors):
        for entity, error in zip(entities, errors, strict=True):
            if error is not None:
                _log.warning(
                    "listing the sessions of %r in %s failed (%s): listed from the other "
                    "region only",
                    entity.entity,
                    entity.region,
                    type(error).__name__,
                )
        return list(listed)
    refused = every_region_refused([e if isinstance(e, RegionError) else None for e in errors])
    if refused is not None:
        raise refused
    if timeout is not None and all(isinstance(e, RegionTimeoutError) for e in errors):
        # Each region's own deadline (the same timeout) ran out just before this call's.
        raise _too_slow(entities, timeout) from errors[0]
    causes = {e.region: error for e, error in zip(entities, errors, strict=True) if error}
    raise AllRegionsUnavailableError(
        f"no region listed the sessions of {entities[0].entity!r}", causes
    )


def _too_slow(entities: Sequence[RegionSessions], timeout: float | None) -> RegionTimeoutError:
    """The SDK's ``OperationTimeoutError`` for a listing that outlasted ``timeout``."""
    return RegionTimeoutError(
        f"listing the sessions of {entities[0].entity!r} took over {timeout} s",
        region=entities[0].region,
        kind=ErrorKind.TIMEOUT,
    )
