"""A GeoReceiver over in-memory regions and seen-set on a FakeClock, for unit tests
(imported as ``from _receivers import ...``)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

from georep import ClaimState, GeoReceiver
from georep.exceptions import region_error
from georep.ports import ErrorKind
from georep.testing import FakeClock, FakeMessage, InMemoryRegionReceiver, InMemorySeenSet


class BulkRegion(InMemoryRegionReceiver):
    """An in-memory region that also completes in bulk (as the SDK adapter does), and
    records each bulk call; ``refuse`` makes the next one fail as a dropped link."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bulk_calls: list[list[str]] = []
        self.refuse = False

    async def complete_many(self, messages: list[Any]) -> None:
        self.bulk_calls.append([m.message_id for m in messages])
        if self.refuse:
            self.refuse = False
            raise region_error("link detached", region=self.region, kind=ErrorKind.CONNECTION)
        for message in messages:
            await self.complete(message)


class CountingSeenSet(InMemorySeenSet):
    """The in-memory seen-set, counting the claims of each (scoped) key."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.claimed: Counter[str] = Counter()

    async def claim(self, keys: Sequence[str], *, owner: str, lease: float) -> list[ClaimState]:
        self.claimed.update(keys)
        return await super().claim(keys, owner=owner, lease=lease)


class ReceiverWorld:
    """One clock, one seen-set; :meth:`geo` builds a GeoReceiver on them."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.seen = CountingSeenSet(clock=self.clock)

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


class RandomMessages:
    """A seeded random set of messages for two regions: ``ids``, where each one's copies
    are (``where``: both regions, mostly, or one, as when a copy's send failed), and a third
    of them that arrive ``late`` (put while the test runs).

    Args:
        rng: The test's seeded random source.
        prefix: Each id's prefix (the seed, say).
        most: At most this many messages (at least one).
    """

    def __init__(self, rng: random.Random, prefix: str, most: int) -> None:
        self.ids = [f"{prefix}-{i}" for i in range(rng.randint(1, most))]
        choices = ["both", "both", "both", "primary", "secondary"]
        self.where = {i: rng.choice(choices) for i in self.ids}
        self.late = rng.sample(self.ids, k=len(self.ids) // 3)

    @property
    def copies(self) -> int:
        """How many copies the regions get in all."""
        return sum(2 if self.where[i] == "both" else 1 for i in self.ids)

    def put(
        self, primary: InMemoryRegionReceiver, secondary: InMemoryRegionReceiver, message_id: str
    ) -> None:
        """Put ``message_id``'s copies in its regions."""
        for region, name in ((primary, "primary"), (secondary, "secondary")):
            if self.where[message_id] in ("both", name):
                region.put(FakeMessage(b"x", message_id))

    def put_early(self, primary: InMemoryRegionReceiver, secondary: InMemoryRegionReceiver) -> None:
        """Put every message that is not late."""
        for message_id in self.ids:
            if message_id not in self.late:
                self.put(primary, secondary, message_id)
