#!/usr/bin/env bash
# Run everything CI runs: lint, types, and the whole test suite (unit + integration against
# the local emulator through the real azure-servicebus SDK, and a real Redis).
source "$(dirname "$0")/_setup.sh" "dev"
source "$(dirname "$0")/redis.sh"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy georep adapters
# Most of the suite waits (on the emulator, on outages, on Spark), so it runs on more
# workers than cores; --dist loadfile keeps each module's emulator and Spark session on one
# worker. GEOREP_TEST_WORKERS=0 runs it in this process.
.venv/bin/python -m pytest -p no:cacheprovider -n "${GEOREP_TEST_WORKERS:-6}" --dist loadfile "$@"
