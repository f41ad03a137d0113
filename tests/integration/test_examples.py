"""The runnable examples the docs point at run, exit 0 and say what they showed."""

from __future__ import annotations

import pytest
from _helpers import REPO, run_python

pytestmark = pytest.mark.integration

EXAMPLES = REPO / "examples"

# One phrase per example that is printed only when its scenario did what the docs say.
EXPECTED = {
    "passive_failover.py": "active region: secondary",
    "active_with_outbox.py": "both regions hold every message",
    "ledger.py": "acknowledged messages was processed once",
    "relay_failover.py": "failovers: 1, role swaps: 1",
}


def test_every_example_has_an_expectation() -> None:
    assert sorted(path.name for path in EXAMPLES.glob("*.py")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_runs(name: str) -> None:
    # Each example starts its own emulator, so they run as the docs say: a plain process.
    completed = run_python(str(EXAMPLES / name), timeout=60)
    output = f"stdout:\n{completed.stdout}\nstderr:\n{completed.stderr[-3000:]}"
    assert completed.returncode == 0, output
    assert EXPECTED[name] in completed.stdout, output
    assert "SharedAccessKey" not in completed.stdout + completed.stderr, "a secret was printed"
