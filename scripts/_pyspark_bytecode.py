"""Give PySpark's Python workers compiled modules: add bytecode to pyspark.zip in .venv.

Spark starts its Python workers with ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's
zip) first on ``PYTHONPATH``, so a worker imports PySpark from that zip, not from
site-packages. A zip of sources has no ``__pycache__``: every worker compiled the PySpark
modules it imports again. Here that took 1.7-1.8 CPU-s per worker start against 0.7 s with
bytecode, and a worker that Spark starts outside its daemon (the streaming source runner,
once per query start) must connect back within 10 s, a bound no setting changes: on a
loaded two-core machine, three Spark source tests failed on "Python worker failed to
connect back".

This adds, next to each non-test ``.py`` of both zips, a ``.pyc`` for this interpreter,
hash-checked against the source in the zip (zipimport tries the bytecode first and falls
back to the source when the hash differs), so tracebacks still show source lines. It is
idempotent (a marker entry names the interpreter's magic number) and a reinstall of
pyspark simply brings back the plain zip, which this makes again.

Usage: .venv/bin/python scripts/_pyspark_bytecode.py   (sourced setup runs it; quiet)
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import sys
import tempfile
import zipfile
from pathlib import Path

MARKER = "georep-bytecode.txt"
#: Flags of a hash-based .pyc whose source hash is checked (PEP 552).
CHECKED_HASH = 0b11


def _pyc(source: bytes, filename: str) -> bytes:
    code = compile(source, filename, "exec", dont_inherit=True)
    header = importlib.util.MAGIC_NUMBER + CHECKED_HASH.to_bytes(4, "little")
    return header + importlib.util.source_hash(source) + marshal.dumps(code)


def _wanted(name: str) -> bool:
    return name.endswith(".py") and "/tests/" not in name and "/testing/" not in name


def add_bytecode(archive: Path) -> bool:
    """Rewrite ``archive`` with bytecode beside its sources; False if it already has it."""
    stamp = importlib.util.MAGIC_NUMBER.hex()
    with zipfile.ZipFile(archive) as source:
        if MARKER in source.namelist() and source.read(MARKER).decode() == stamp:
            return False
        fd, partial = tempfile.mkstemp(dir=archive.parent, suffix=".partial")
        os.close(fd)
        try:
            with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as target:
                for info in source.infolist():
                    if info.filename.endswith(".pyc") or info.filename == MARKER:
                        continue
                    data = source.read(info)
                    target.writestr(info, data)
                    if _wanted(info.filename):
                        path = f"{archive}{os.sep}{info.filename}"
                        entry = zipfile.ZipInfo(info.filename[:-3] + ".pyc", info.date_time)
                        entry.compress_type = zipfile.ZIP_STORED  # inflating costs 15%
                        target.writestr(entry, _pyc(data, path))
                target.writestr(MARKER, stamp)
            os.chmod(partial, archive.stat().st_mode)
            os.replace(partial, archive)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    return True


def main() -> int:
    try:
        import pyspark
    except ImportError:
        return 0  # no Spark in this environment
    lib = Path(pyspark.__file__).parent / "python" / "lib"
    for archive in sorted(lib.glob("*.zip")):
        try:
            add_bytecode(archive)
        except (OSError, SyntaxError, zipfile.BadZipFile) as exc:
            # Workers then compile the sources as before: slower, not wrong.
            print(f"{__file__}: {archive.name} left as it is: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
