"""An adapter whose extra is missing names the extra to install."""

from __future__ import annotations

import pytest

from georep._extras import require_extra


def test_a_missing_module_names_the_adapter_and_the_pip_extra() -> None:
    with pytest.raises(ImportError) as caught:
        require_extra("georep.adapters.spark", "spark", "json", "no_such_module_xyz")
    assert str(caught.value) == (
        "georep.adapters.spark needs no_such_module_xyz: pip install 'georep[spark]'"
    )


def test_installed_modules_pass() -> None:
    require_extra("georep.adapters.redis", "redis", "json", "asyncio")
