"""Without its extra, the ``georep`` command names the extra to install (no traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from georep.cli import EXTRA_HINT

REPO = Path(__file__).resolve().parents[2]


def _without(module: str, tmp_path: Path) -> dict[str, str]:
    """An environment where importing ``module`` fails as if it were not installed: a
    package of that name first on the path, whose import raises ImportError."""
    stub = tmp_path / module
    stub.mkdir(exist_ok=True)
    (stub / "__init__.py").write_text(
        f'raise ImportError("No module named {module} (a test stub)", name="{module}")\n'
    )
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}


@pytest.mark.parametrize(
    ("missing", "command"),
    [
        ("typer", [str(Path(sys.executable).parent / "georep"), "--help"]),
        ("rich", [sys.executable, "-m", "georep.cli", "emulator", "--help"]),
    ],
    ids=["georep-script-without-typer", "python-m-without-rich"],
)
def test_the_command_without_its_extra_prints_the_pip_line_and_exits_2(
    missing: str, command: list[str], tmp_path: Path
) -> None:
    result = subprocess.run(
        command, env=_without(missing, tmp_path), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr == EXTRA_HINT + "\n"
    assert result.stdout == ""


def test_the_library_still_imports_without_the_extra(tmp_path: Path) -> None:
    probe = "import georep, georep.cli; print(georep.GeoSender.__name__)"
    result = subprocess.run(
        [sys.executable, "-c", probe],
        env=_without("typer", tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.strip() == "GeoSender"
    # The app itself is what needs the extra: asking for it says so.
    result = subprocess.run(
        [sys.executable, "-c", "from georep.cli import app"],
        env=_without("typer", tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and EXTRA_HINT in result.stderr
