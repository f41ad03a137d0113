"""How the drop-in administration client turns both namespaces' answers into one
(georep.servicebus._admin), without a broker."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError

from georep.servicebus._admin import changed, differences, merge_listed, read


def queue(name: str, **settings: object) -> SimpleNamespace:
    return SimpleNamespace(name=name, created_at_utc=object(), **settings)


def test_a_create_already_done_in_one_namespace_counts_as_done() -> None:
    created = queue("q")
    assert changed("create_queue", {"primary": created, "secondary": ResourceExistsError("x")}) is (
        created
    )


def test_a_change_that_failed_in_one_namespace_raises_its_error_saying_so() -> None:
    refused = HttpResponseError("quota")
    with pytest.raises(HttpResponseError) as raised:
        changed("update_queue", {"primary": None, "secondary": refused})
    assert raised.value is refused
    assert any("applied in primary" in note for note in raised.value.__notes__)


def test_a_delete_of_what_neither_namespace_has_raises_the_sdks_error() -> None:
    missing = ResourceNotFoundError("primary")
    with pytest.raises(ResourceNotFoundError) as raised:
        changed("delete_queue", {"primary": missing, "secondary": ResourceNotFoundError("s")})
    assert raised.value is missing


def test_differences_name_each_setting_that_differs_and_ignore_times() -> None:
    found = differences(
        {
            "primary": queue("q", lock_duration=timedelta(seconds=30), max_delivery_count=5),
            "secondary": queue("q", lock_duration=timedelta(seconds=30), max_delivery_count=9),
        }
    )
    assert found == {"max_delivery_count": {"primary": 5, "secondary": 9}}


def test_a_get_answers_from_the_secondary_when_only_it_has_the_entity() -> None:
    only = queue("q", max_delivery_count=3)
    got = read("get_queue", {"primary": ResourceNotFoundError("x"), "secondary": only})
    assert got is only and set(got.georep_regions) == {"secondary"}


def test_a_list_keeps_the_primarys_order_then_what_only_the_secondary_has() -> None:
    listed = merge_listed(
        {
            "primary": [queue("b"), queue("a")],
            "secondary": [queue("a"), queue("c")],
        }
    )
    assert [q.name for q in listed] == ["b", "a", "c"]
    assert [sorted(q.georep_regions) for q in listed] == [
        ["primary"],
        ["primary", "secondary"],
        ["secondary"],
    ]
