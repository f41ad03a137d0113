"""The layers a reader is told about: the core never imports an adapter, save through one door.

``georep/`` is the core (it defines the ports); ``adapters/`` implements them and is
installed as ``georep.adapters``; ``georep.cli`` is the application on top of both.
The core reaches the SDK only through ``georep/_sdk.py`` (the convenience constructors).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "georep"
#: Allowed to import adapters: the declared boundary, and the application package.
BOUNDARY = CORE / "_sdk.py"
APPLICATION = CORE / "cli"


def _modules(folder: Path) -> list[Path]:
    """Every .py file under ``folder``, not following the georep/adapters symlink."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        if any(part.is_symlink() for part in (path, *path.parents) if part != ROOT):
            continue
        found.append(path)
    return found


def _imported(path: Path) -> list[tuple[int, str]]:
    """``(line, dotted name)`` for every module ``path`` imports, relative ones resolved."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "adapters":  # installed (and imported) as georep.adapters
        parts.insert(0, "georep")
    package = ".".join(parts[:-1])
    names: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            # `from georep import adapters` imports georep.adapters too.
            names += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
            names.append((node.lineno, base))
    return names


def _imports_adapters(name: str) -> bool:
    return name == "georep.adapters" or name.startswith("georep.adapters.")


def test_the_core_imports_adapters_only_through_the_sdk_boundary() -> None:
    core = [p for p in _modules(CORE) if p != BOUNDARY and APPLICATION not in p.parents]
    assert CORE / "_sender.py" in core and CORE / "testing" / "__init__.py" in core
    offenders = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in core
        for line, name in _imported(path)
        if _imports_adapters(name)
    ]
    assert offenders == [], "import georep._sdk instead:\n" + "\n".join(offenders)


def test_the_boundary_is_what_imports_the_servicebus_adapter() -> None:
    assert any(name == "georep.adapters.servicebus" for _, name in _imported(BOUNDARY))


def test_nothing_imports_the_adapters_folder_by_its_checkout_name() -> None:
    # adapters/ is importable as a top-level package from a checkout (the checkout root is
    # on sys.path), but those would be second copies of georep.adapters' modules.
    offenders = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for folder in ("georep", "adapters", "tests", "scripts", "benchmarks", "examples")
        for path in _modules(ROOT / folder)
        for line, name in _imported(path)
        if name == "adapters" or name.startswith("adapters.")
    ]
    assert offenders == [], "import georep.adapters...:\n" + "\n".join(offenders)


def test_importing_the_library_loads_no_adapter_and_no_sdk() -> None:
    # The SDK is an optional extra: the boundary is imported by the functions that need
    # it, never when the library is imported.
    probe = (
        "import sys, georep, georep.sync, georep.testing; "
        "print(sorted(m for m in sys.modules if m.startswith("
        "('georep.adapters', 'georep._sdk', 'georep.cli', 'azure'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert result.stdout.strip() == "[]", result.stdout
