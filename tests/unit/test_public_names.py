"""georep's top-level names are the library's surface: no test doubles, no internals."""

from __future__ import annotations

import importlib
import warnings

import pytest

import georep
import georep.testing

# Where each name that left the top level lives now.
MOVED = {
    "InMemoryRoleStore": "georep.testing",
    "EmulatorError": "georep.exceptions",
    "peek_all": "georep.receive.peek",
}


def test_the_top_level_exports_no_test_double_or_internal() -> None:
    assert not set(MOVED) & set(georep.__all__)
    assert not [name for name in georep.__all__ if name.startswith(("InMemory", "Fake"))]
    assert "InMemoryRoleStore" in georep.testing.__all__


@pytest.mark.parametrize("name", sorted(MOVED))
def test_a_moved_name_still_resolves_for_one_release_with_a_warning(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A name resolved once is cached in the module: forget it for this test.
    monkeypatch.delitem(vars(georep), name, raising=False)
    with pytest.warns(DeprecationWarning, match=rf"georep\.{name} .*next release"):
        value = getattr(georep, name)
    assert value is getattr(importlib.import_module(MOVED[name]), name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert getattr(georep, name) is value  # warned once


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = georep.no_such_name  # type: ignore[attr-defined]
