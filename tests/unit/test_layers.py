"""The layers a reader is told about: the core never imports an adapter, save through one door.

``georep/`` is the core (it defines the ports); ``adapters/`` implements them and is
installed as ``georep.adapters``; ``georep.cli`` is the application on top of both.
The core reaches the SDK's adapter only through ``georep/_sdk.py`` (the convenience
constructors), and the SDK itself at import time only through ``georep/_sdk_errors.py``
(the exception classes georep's errors also are, issue 27).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "georep"
#: Allowed to import adapters: the declared boundary, and the application package.
BOUNDARY = CORE / "_sdk.py"
APPLICATION = CORE / "cli"
#: The drop-in client mirrors the SDK's own surface (its types, its receive modes, its
#: messages): it is the one part of the core that imports the SDK freely, as the
#: application does. It still reaches the adapters only through georep._sdk.
DROP_IN = CORE / "servicebus"
#: The one core module that imports the SDK at module level: its exception classes.
SDK_ERRORS = CORE / "_sdk_errors.py"


def _modules(folder: Path) -> list[Path]:
    """Every .py file under ``folder``, not following the georep/adapters symlink."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        if any(part.is_symlink() for part in (path, *path.parents) if part != ROOT):
            continue
        found.append(path)
    return found


def _type_checking_lines(tree: ast.Module) -> set[int]:
    """The lines of ``if TYPE_CHECKING:`` bodies (imports there never run)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _imported(path: Path, *, runtime_only: bool = False) -> list[tuple[int, str]]:
    """``(line, dotted name)`` for every module ``path`` imports, relative ones resolved
    (with ``runtime_only``, not those under ``if TYPE_CHECKING:``)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "adapters":  # installed (and imported) as georep.adapters
        parts.insert(0, "georep")
    package = ".".join(parts[:-1])
    names: list[tuple[int, str]] = []
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
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
    if runtime_only:
        skipped = _type_checking_lines(tree)
        names = [(line, name) for line, name in names if line not in skipped]
    return names


def _imports_adapters(name: str) -> bool:
    return name == "georep.adapters" or name.startswith("georep.adapters.")


def test_the_core_imports_adapters_only_through_the_sdk_boundary() -> None:
    core = [p for p in _modules(CORE) if p != BOUNDARY and APPLICATION not in p.parents]
    assert CORE / "send/sender.py" in core and CORE / "testing" / "__init__.py" in core
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


def test_only_the_sdk_errors_module_imports_the_sdk_at_run_time() -> None:
    # The SDK is an optional extra; the core imports it (outside type checking) in one
    # module, and only its exceptions module there. (georep._sdk reaches it through the
    # adapter, inside the functions that need it.)
    core = [p for p in _modules(CORE) if APPLICATION not in p.parents and DROP_IN not in p.parents]
    offenders = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in core
        if path != SDK_ERRORS
        for line, name in _imported(path, runtime_only=True)
        if name == "azure" or name.startswith("azure.")
    ]
    assert offenders == [], "the core imports the SDK only in georep/_sdk_errors.py:\n" + (
        "\n".join(offenders)
    )
    exceptions = "azure.servicebus.exceptions"
    sdk_names = [name for _, name in _imported(SDK_ERRORS) if name.startswith("azure")]
    assert sdk_names and all(n == exceptions or n.startswith(f"{exceptions}.") for n in sdk_names)


# The error layer, bottom up: each module imports only those before it (function-level
# imports too), so nothing below georep.exceptions can need it back. A circle here once
# made RegionError.retryable import georep._classify inside the property.
ERROR_LAYER = {
    "georep._slot": set(),
    "georep.ports.clock": set(),
    "georep.ports.codec": set(),
    "georep.ports.ledger": set(),
    "georep.ports.regions": {"georep._slot", "georep.ports.codec"},
    "georep.ports.relay": set(),
    "georep.ports.stores": set(),
    "georep.ports": {
        "georep._slot",
        "georep.ports.clock",
        "georep.ports.codec",
        "georep.ports.ledger",
        "georep.ports.regions",
        "georep.ports.relay",
        "georep.ports.stores",
    },
    "georep._classify": {"georep.ports"},
    "georep._sdk_errors": set(),
    "georep._secrets": set(),
    "georep.exceptions": {
        "georep.ports",
        "georep._classify",
        "georep._sdk_errors",
        "georep._secrets",
    },
}


def _source_of(module: str) -> Path | None:
    """The file of ``module``: ``georep/x.py``, or a package's ``georep/x/__init__.py``."""
    base = ROOT / module.replace(".", "/")
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


@pytest.mark.parametrize("module", sorted(ERROR_LAYER))
def test_the_error_layer_imports_only_downward(module: str) -> None:
    path = _source_of(module)
    assert path is not None, module
    imported = {
        name
        for _, name in _imported(path)
        if name.startswith("georep.") and name.rsplit(".", 1)[0] != "georep.exceptions"
    }
    # `from georep.x import Name` lists georep.x.Name too: keep the modules.
    modules = {name for name in imported if _source_of(name) is not None}
    assert modules <= ERROR_LAYER[module], (
        f"{module} imports {sorted(modules - ERROR_LAYER[module])}"
    )


def _loaded_after(statement: str, *, block_sdk: bool = False) -> list[str]:
    """The azure and georep-adapter modules loaded by ``statement`` in a fresh interpreter
    (with ``block_sdk``, as if azure-servicebus were not installed)."""
    blocker = (
        "import sys\n"
        "class _NoAzure:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'azure' or name.startswith('azure.'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, _NoAzure())\n"
        if block_sdk
        else "import sys\n"
    )
    probe = (
        f"{blocker}{statement}\n"
        "print('\\n'.join(sorted(m for m in sys.modules if m.startswith("
        "('georep.adapters', 'georep._sdk.', 'georep.cli', 'azure')) or m == 'georep._sdk')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return result.stdout.split()


def test_importing_the_library_loads_no_adapter_and_of_the_sdk_only_its_exceptions() -> None:
    # The adapters (and georep._sdk, their door) load in the functions that need them; the
    # SDK loads only as far as its exceptions module takes it (georep's errors subclass
    # those classes).
    loaded = _loaded_after("import georep, georep.sync, georep.testing")
    assert not [name for name in loaded if not name.startswith("azure")], loaded
    assert "azure.servicebus.exceptions" in loaded
    assert set(loaded) <= set(_loaded_after("import azure.servicebus.exceptions"))


def test_without_the_sdk_the_library_imports_and_its_errors_keep_both_hierarchies() -> None:
    statement = (
        "import georep, georep.sync, georep.testing\n"
        "from georep._sdk_errors import SDK_INSTALLED, sdk\n"
        "error = georep.MessageTooLargeError('x', region='primary', kind='message-too-large')\n"
        "assert not SDK_INSTALLED\n"
        "assert isinstance(error, georep.RegionError) and isinstance(error, sdk.ServiceBusError)\n"
        "assert isinstance(error, ValueError)\n"
        "assert issubclass(georep.AuthenticationError, PermissionError)\n"
        "assert issubclass(georep.ClosedError, ValueError)"
    )
    assert _loaded_after(statement, block_sdk=True) == []


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_cycles(modules: dict[str, Path]) -> list[list[str]]:
    """Every circle of imports among ``modules`` (any import: top-level, inside a function or
    under TYPE_CHECKING), as the modules on it. An import of a package a module is inside
    (``from georep import __version__``) is not counted: the facade is not a layer."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for _, imported in _imported(path):
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name and not name.startswith(imported + "."):
                targets.add(imported)
        graph[name] = targets
    cycles: list[list[str]] = []
    done: set[str] = set()

    def visit(node: str, trail: list[str]) -> None:
        if node in trail:
            cycle = trail[trail.index(node) :]
            if sorted(cycle) not in [sorted(c) for c in cycles]:
                cycles.append(cycle)
            return
        if node in done:
            return
        for target in sorted(graph[node]):
            visit(target, [*trail, node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    return cycles


def test_the_core_imports_run_downward() -> None:
    # Issue 26: a reader finds a concept by going down the layers; a circle (exceptions and
    # _classify importing each other, say) means neither is below the other.
    modules = {
        _module_name(path): path
        for path in _modules(CORE)
        if APPLICATION not in path.parents and path != BOUNDARY
    }
    assert "georep.exceptions" in modules and "georep.ports" in modules
    cycles = _import_cycles(modules)
    assert cycles == [], "\n".join(" -> ".join([*c, c[0]]) for c in cycles)


def test_the_cycle_finder_names_a_circle(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("import georep\nfrom georep.b import x\n")
    (tmp_path / "b.py").write_text("def f():\n    from georep.a import y\n")
    (tmp_path / "c.py").write_text("from georep.a import z\n")
    names = {"georep.a": tmp_path / "a.py", "georep.b": tmp_path / "b.py"}
    names["georep.c"] = tmp_path / "c.py"
    global ROOT
    saved, ROOT = ROOT, tmp_path.parent
    try:
        assert _import_cycles(names) == [["georep.a", "georep.b"]]
    finally:
        ROOT = saved


def test_no_two_test_modules_share_a_name() -> None:
    # tests/ has no __init__.py files: pytest imports each module by its basename, and a
    # second module of the same name fails the whole run at collection ("import file
    # mismatch"), as tests/unit/test_fork.py beside tests/integration/test_fork.py did.
    names: dict[str, list[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in names.items() if len(paths) > 1} == {}
