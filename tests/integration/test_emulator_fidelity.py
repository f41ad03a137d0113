"""The fidelity table of docs/emulator.md names exactly the operations the checks run.

The checks themselves run in the ``test_fidelity_*.py`` modules (see ``_fidelity.py``).
"""

from __future__ import annotations

import pytest
import test_fidelity_admin
import test_fidelity_connect
import test_fidelity_messaging
import test_fidelity_sessions
from _fidelity import CHECKS, fidelity_rows, supported

pytestmark = pytest.mark.integration

_MODULES = (
    test_fidelity_admin,
    test_fidelity_connect,
    test_fidelity_messaging,
    test_fidelity_sessions,
)


def test_the_table_and_the_checks_name_the_same_operations() -> None:
    # Every check module registered checks (the imports above ran them), and no other did.
    assert {check.__module__ for check in CHECKS.values()} == {m.__name__ for m in _MODULES}
    listed = {operation for operation, _ in fidelity_rows()}
    rows = supported()
    assert not [op for op in rows if op not in CHECKS], "supported rows without a check"
    assert not [op for op in CHECKS if op not in listed], "checks without a row in the table"
    assert len(rows) >= 30, "the table did not parse"
