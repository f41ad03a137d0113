"""Turn what a caller passed as a region (a port, or an SDK sender/receiver) into the port.

A :class:`georep.ports.RegionSender` or :class:`~georep.ports.RegionReceiver` is used as it
is; an SDK object is wrapped by the Service Bus adapter, reached through the core's one door
to it (:mod:`georep._sdk`): async SDK objects run on the loop, sync ones on a worker thread
per SDK object. Without the SDK extra the wrapping fails with the ``pip install`` hint.
"""

from __future__ import annotations

__all__ = ["check_pair", "open_pair", "wrap_pair"]

from collections.abc import Callable
from typing import Any, Literal, TypeVar

from georep._endpoint import Target
from georep.exceptions import ConfigurationError
from georep.ports import RegionReceiver, RegionSender

_Region = TypeVar("_Region")


def wrap_pair(
    primary: Any, secondary: Any, kind: Literal["sender", "receiver"]
) -> tuple[list[Any], list[Any]]:
    """The two regions' ports, and those wrapped here (the caller closes their threads).

    A :class:`~georep.ports.RegionSender` (or ``RegionReceiver``) is used as it is; an SDK
    sender or receiver is wrapped and labelled ``"primary"`` or ``"secondary"``.
    """
    regions: list[Any] = []
    created: list[Any] = []
    for given, label in ((primary, "primary"), (secondary, "secondary")):
        region = _as_region(given, label, kind)
        regions.append(region)
        if region is not given:
            created.append(region)
    return regions, created


def open_pair(
    open_region: Callable[..., _Region], primary: Target, secondary: Target, **options: Any
) -> tuple[_Region, _Region]:
    """Both regions opened from their connection strings, labelled primary and secondary.

    ``open_region`` is the adapter's ``open_region_sender`` or ``open_region_receiver``
    (from :mod:`georep._sdk`); ``options`` go to both calls.
    """
    return (
        open_region(primary, region="primary", **options),
        open_region(secondary, region="secondary", **options),
    )


def check_pair(first: Any, second: Any, *, what: str, where: str, needs: str) -> None:
    """Check that two regions have labels of their own and differ in ``where``.

    Args:
        first: One region (anything with a ``region`` label and a ``where`` attribute).
        second: The other region.
        what: What they are, for the message (``"senders"``, ``"endpoints"``).
        where: The attribute naming where a region is (``namespace``, ``address``).
        needs: Why they must differ, for the message.

    Raises:
        ConfigurationError: Both have one label, or are in one place.
    """
    if first.region == second.region:
        raise ConfigurationError(
            f"both {what} are labelled {first.region!r}: give each its own region label"
        )
    place = getattr(first, where)
    if place == getattr(second, where):
        raise ConfigurationError(f"both {what} are in the same {where} ({place}): {needs}")


def _as_region(given: Any, region: str, kind: Literal["sender", "receiver"]) -> Any:
    if isinstance(given, RegionSender if kind == "sender" else RegionReceiver):
        return given
    try:
        from georep import _sdk
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigurationError(
            f"{region} {kind} is a {type(given).__name__}; wrapping an SDK {kind} needs "
            "pip install 'georep[servicebus]'"
        ) from exc
    wrap = _sdk.region_sender_for if kind == "sender" else _sdk.region_receiver_for
    return wrap(given, region=region)
