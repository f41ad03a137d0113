"""What the drop-in administration clients (sync and async) share: how one operation's
answers from both namespaces become one answer.

The paired-namespace guidance wants every entity in both namespaces with the same
settings, so every create, update and delete is applied to both; a get or list answers with
the primary's properties (the secondary's where only it has the entity), each annotated
with ``georep_regions`` (region label → that namespace's properties) and
``georep_differences`` (setting → region label → value, for the settings that differ).
"""

from __future__ import annotations

__all__ = ["REGIONS", "TwoNamespaces", "annotate", "changed", "differences", "merge_listed", "read"]

import logging
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, ClassVar, Final, Self

from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError

from georep._endpoint import endpoint_pair

_log = logging.getLogger("georep.servicebus")

REGIONS: Final = ("primary", "secondary")
_NOT_SETTINGS: Final = frozenset(
    {
        "name",
        "alias",
        "created_at_utc",
        "modified_at_utc",
        "updated_at_utc",
        "accessed_at_utc",
        "availability_status",
    }
)
"""Properties that name an entity or say when something happened: not its settings."""


def _comparable(value: Any) -> Any:
    """``value`` as something ``==`` compares by content (a rule's filter, an action...)."""
    if value is None or isinstance(value, str | int | float | bool | timedelta):
        return value
    if isinstance(value, Mapping):
        return {str(k): _comparable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_comparable(v) for v in value]
    public = (
        {k: v for k, v in vars(value).items() if not k.startswith("_")}
        if hasattr(value, "__dict__")
        else None
    )
    if public is None:
        return repr(value)
    return {"type": type(value).__name__, **{k: _comparable(v) for k, v in public.items()}}


def settings(properties: Any) -> dict[str, Any]:
    """An entity's settings (its public properties but names and times), comparable."""
    return {
        name: _comparable(value)
        for name, value in vars(properties).items()
        if not name.startswith(("_", "georep_")) and name not in _NOT_SETTINGS
    }


def differences(by_region: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The settings whose values differ between the regions: setting → region → value."""
    each = {region: settings(properties) for region, properties in by_region.items()}
    names = sorted({name for values in each.values() for name in values})
    found: dict[str, dict[str, Any]] = {}
    for name in names:
        values = {region: values.get(name) for region, values in each.items()}
        if len({repr(v) for v in values.values()}) > 1 or len(values) < len(by_region):
            found[name] = values
    return found


def annotate(properties: Any, by_region: Mapping[str, Any]) -> Any:
    """``properties`` with ``georep_regions`` and ``georep_differences`` set."""
    properties.georep_regions = dict(by_region)
    properties.georep_differences = differences(by_region) if len(by_region) > 1 else {}
    return properties


def changed(operation: str, results: Mapping[str, Any]) -> Any:
    """One answer for a create, update or delete applied to both namespaces.

    Every region answered: the primary's result. A create that found the entity already
    there in one region while the other created it, or a delete that found it gone in one
    region while the other deleted it, counts as done (the regions agree now; logged).

    Raises:
        The SDK's error of the region that failed (a note says what the other region did),
        or the primary's when every region failed.
    """
    failures = {r: v for r, v in results.items() if isinstance(v, BaseException)}
    successes = {r: v for r, v in results.items() if not isinstance(v, BaseException)}
    if not failures:
        return successes[REGIONS[0]]
    agreeing = ResourceExistsError if operation.startswith("create") else ResourceNotFoundError
    if successes and all(isinstance(e, agreeing) for e in failures.values()):
        _log.warning(
            "%s: already done in %s; done now in %s (compare their settings with a get)",
            operation,
            ", ".join(failures),
            ", ".join(successes),
        )
        return next(iter(successes.values()))
    first_region, error = next(iter(failures.items()))
    if successes:
        error.add_note(
            f"georep: {operation} failed in {first_region} but was applied in "
            f"{', '.join(successes)}; the namespaces differ until it is applied there too"
        )
    elif len(failures) > 1:
        others = "; ".join(f"{r}: {type(e).__name__}" for r, e in list(failures.items())[1:])
        error.add_note(f"georep: {operation} failed in {first_region} and in {others}")
    raise error


def read(operation: str, results: Mapping[str, Any]) -> Any:
    """One answer for a get: the primary's properties (the secondary's where the primary
    failed), annotated with every region that answered.

    Raises:
        The primary's error, when no region answered.
    """
    answered = {r: v for r, v in results.items() if not isinstance(v, BaseException)}
    if not answered:
        error: BaseException = results[REGIONS[0]]
        raise error
    for region, failure in results.items():
        if isinstance(failure, BaseException) and not isinstance(failure, ResourceNotFoundError):
            _log.warning("%s: %s did not answer (%s)", operation, region, type(failure).__name__)
    first = next(iter(answered.values()))
    return annotate(first, answered)


def merge_listed(by_region: Mapping[str, Sequence[Any]]) -> list[Any]:
    """One list from each region's: the primary's entities in its order, then those only
    the secondary has; each annotated with the regions that have it."""
    merged: dict[str, dict[str, Any]] = {}
    for region, items in by_region.items():
        for item in items:
            merged.setdefault(str(item.name), {})[region] = item
    listed = []
    for regions in merged.values():
        first = next(iter(regions.values()))
        listed.append(annotate(first, regions))
    return listed


class TwoNamespaces:
    """The constructors the sync and async administration clients share, each over the
    SDK's administration client of its kind (``_sdk_admin``)."""

    _sdk_admin: ClassVar[Any]

    def __init__(self, primary: Any, secondary: Any) -> None:
        raise NotImplementedError

    @classmethod
    def from_connection_strings(cls, primary: str, secondary: str, **kwargs: Any) -> Self:
        """Clients on both namespaces; ``kwargs`` go to both (``connection_verify``...)."""
        return cls(
            cls._sdk_admin.from_connection_string(primary, **kwargs),
            cls._sdk_admin.from_connection_string(secondary, **kwargs),
        )

    @classmethod
    def from_namespaces(cls, primary: str, secondary: str, credential: Any, **kwargs: Any) -> Self:
        """Clients on both namespaces reached with ``credential`` (the SDK's credentials)."""
        first, second = endpoint_pair(primary, secondary, credential, None)
        return cls(
            cls._sdk_admin(primary, first.credential, **kwargs),
            cls._sdk_admin(secondary, second.credential, **kwargs),
        )
