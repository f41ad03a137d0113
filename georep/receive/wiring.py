"""How a GeoReceiver's loops are put together (its composition root).

One :class:`georep.receive.region_loop.RegionLoop` per region, or in session mode one
:class:`georep.receive.session_loop.SessionRegionLoop` per region that makes a region loop for
each session it holds; each loop gets its own settler and seen-set owner, and all of them
the receiver's one :class:`georep.receive.context.ReceiveContext`. Nothing here imports
:mod:`georep.receive.receiver`, so no import cycle appears.
"""

from __future__ import annotations

__all__ = ["region_loop", "session_loops"]

from collections.abc import Callable, Sequence

from georep.ports import RegionReceiver, RegionSessions, SessionReceiver
from georep.receive.context import ReceiveContext
from georep.receive.region_loop import LoopPolicy, RegionLoop
from georep.receive.session_loop import FinishedKeys, SessionPolicy, SessionRegionLoop
from georep.receive.settlement import Copy, Settlements


def region_loop(
    region: RegionReceiver,
    context: ReceiveContext,
    policy: LoopPolicy,
    owner: str,
    on_final: Callable[[Copy], None] | None = None,
) -> RegionLoop:
    """The loop of ``region`` (or of one held session), with its own settler and seen-set
    owner; ``on_final`` is told of each copy settled for good (session mode)."""
    settlements = Settlements(region, context)
    settlements.on_final = on_final
    # One owner per region loop: the twin in the other region must not find "our" claim
    # and process the message a second time.
    return RegionLoop(settlements, owner=f"{owner}/{region.region}", context=context, policy=policy)


def session_loops(
    regions: Sequence[RegionSessions],
    context: ReceiveContext,
    policy: SessionPolicy,
    owner: str,
) -> list[SessionRegionLoop]:
    """One session loop per region, each knowing the other (for the order gate)."""
    finished = FinishedKeys()

    def make_loop(session: SessionReceiver, on_final: Callable[[Copy], None]) -> RegionLoop:
        return region_loop(session, context, policy, owner, on_final)

    loops = [
        SessionRegionLoop(
            region, make_loop=make_loop, finished=finished, context=context, policy=policy
        )
        for region in regions
    ]
    loops[0].other, loops[1].other = loops[1], loops[0]
    return loops
