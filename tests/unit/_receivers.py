"""A GeoReceiver over in-memory regions and seen-set on a FakeClock, for unit tests
(imported as ``from _receivers import ...``)."""

from __future__ import annotations

from typing import Any

from georep import GeoReceiver
from georep.testing import FakeClock, InMemoryRegionReceiver, InMemorySeenSet


class ReceiverWorld:
    """One clock, one seen-set; :meth:`geo` builds a GeoReceiver on them."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.seen = InMemorySeenSet(clock=self.clock)

    def count_claims(self) -> list[str]:
        """From now on, every key claimed in the seen-set is appended to the list returned."""
        claimed: list[str] = []
        claim = self.seen.claim

        async def counting_claim(keys: Any, **terms: Any) -> Any:
            claimed.extend(keys)
            return await claim(keys, **terms)

        self.seen.claim = counting_claim  # type: ignore[method-assign]
        return claimed

    def regions(self) -> tuple[InMemoryRegionReceiver, InMemoryRegionReceiver]:
        """A primary (east) and a secondary (west) region on this world's clock."""
        return (
            InMemoryRegionReceiver("primary", "east", clock=self.clock),
            InMemoryRegionReceiver("secondary", "west", clock=self.clock),
        )

    def geo(self, primary: Any, secondary: Any, **options: Any) -> GeoReceiver:
        """A GeoReceiver on the two regions (``max_wait`` 1 s and ``lease`` 10 s unless given)."""
        options.setdefault("max_wait", 1.0)
        options.setdefault("lease", 10.0)
        return GeoReceiver(primary, secondary, seen=self.seen, clock=self.clock, **options)
