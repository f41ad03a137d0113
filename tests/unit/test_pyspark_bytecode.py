"""scripts/_pyspark_bytecode.py: bytecode beside the sources of a zip on PYTHONPATH, used
by zipimport while it matches its source, ignored once it does not."""

from __future__ import annotations

import importlib.util
import stat
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture
def bytecode() -> ModuleType:
    path = SCRIPTS / "_pyspark_bytecode.py"
    spec = importlib.util.spec_from_file_location("_pyspark_bytecode", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _zip(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    path.chmod(0o644)
    return path


def _import_from(archive: Path, module: str) -> list[str]:
    """``[module.__file__, module.VALUE, the traceback's last source line]`` in a new
    interpreter with ``archive`` first on its path (as Spark starts a worker)."""
    code = (
        f"import sys, traceback; sys.path.insert(0, {str(archive)!r}); import {module} as m\n"
        "try:\n    m.fail()\nexcept ValueError as exc:\n"
        "    line = traceback.extract_tb(exc.__traceback__)[-1].line\n"
        "print(m.__file__); print(m.VALUE); print(line)"
    )
    result = subprocess.run(
        [sys.executable, "-B", "-c", code], capture_output=True, text=True, check=True
    )
    return result.stdout.splitlines()


SOURCE = "VALUE = 'from source'\ndef fail():\n    raise ValueError('boom')\n"


def test_modules_load_from_the_added_bytecode_with_source_lines_in_tracebacks(
    bytecode: ModuleType, tmp_path: Path
) -> None:
    archive = _zip(tmp_path / "lib.zip", {"pkg/__init__.py": "", "pkg/mod.py": SOURCE})

    assert bytecode.add_bytecode(archive) is True

    names = zipfile.ZipFile(archive).namelist()
    assert {"pkg/__init__.pyc", "pkg/mod.pyc", "pkg/mod.py", bytecode.MARKER} <= set(names)
    assert stat.S_IMODE(archive.stat().st_mode) == 0o644
    file, value, line = _import_from(archive, "pkg.mod")
    assert file.endswith("lib.zip/pkg/mod.pyc")
    assert value == "from source"
    assert line == "raise ValueError('boom')"


def test_a_second_run_changes_nothing(bytecode: ModuleType, tmp_path: Path) -> None:
    archive = _zip(tmp_path / "lib.zip", {"pkg/__init__.py": "", "pkg/mod.py": SOURCE})
    bytecode.add_bytecode(archive)
    before = archive.read_bytes()

    assert bytecode.add_bytecode(archive) is False
    assert archive.read_bytes() == before


def test_bytecode_whose_source_changed_is_ignored(bytecode: ModuleType, tmp_path: Path) -> None:
    archive = _zip(tmp_path / "lib.zip", {"pkg/__init__.py": "", "pkg/mod.py": SOURCE})
    bytecode.add_bytecode(archive)
    edited = tmp_path / "edited.zip"
    with zipfile.ZipFile(archive) as old, zipfile.ZipFile(edited, "w") as new:
        for info in old.infolist():
            data = old.read(info)
            if info.filename == "pkg/mod.py":
                data = SOURCE.replace("from source", "edited").encode()
            new.writestr(info, data)

    assert _import_from(edited, "pkg.mod")[1] == "edited"


def test_test_modules_keep_only_their_source(bytecode: ModuleType, tmp_path: Path) -> None:
    archive = _zip(tmp_path / "lib.zip", {"pkg/__init__.py": "", "pkg/tests/test_x.py": "X = 1\n"})
    bytecode.add_bytecode(archive)
    assert "pkg/tests/test_x.pyc" not in zipfile.ZipFile(archive).namelist()
