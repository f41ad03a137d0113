# Shared by scripts/demo.sh and scripts/test.sh: create .venv and install georep into it.
# Usage: source scripts/_setup.sh EXTRAS   (e.g. "dev" or "emulator,cli")
set -euo pipefail
GEOREP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$GEOREP_ROOT"

find_python() {
    for candidate in python3.11 python3 python; do
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    echo "georep needs Python >= 3.11 on PATH" >&2
    return 1
}

PYTHON="$(find_python)"
if [ ! -x .venv/bin/python ]; then
    if ! "$PYTHON" -m venv .venv 2>/dev/null; then
        # Debian ships venv separately.
        if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
            apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
            rm -rf .venv && "$PYTHON" -m venv .venv
        else
            echo "cannot create a virtualenv: install python3-venv" >&2
            exit 1
        fi
    fi
fi
stamp=".venv/.georep-installed-$1"
# Reinstall when pyproject.toml changed since the last install of these extras.
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
    # A plain editable install: georep/adapters is a symlink to adapters/, so the source
    # tree has the installed layout and setuptools writes a static .pth (see pyproject.toml).
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$1]"
    touch "$stamp"
fi
# Spark's Python workers import PySpark from a zip of sources: give it bytecode, once
# (scripts/_pyspark_bytecode.py says why; without pyspark installed it does nothing).
.venv/bin/python -W ignore scripts/_pyspark_bytecode.py
