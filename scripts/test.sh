#!/usr/bin/env bash
# Run everything CI runs: lint, types, and the whole test suite (unit + integration against
# the local emulator through the real azure-servicebus SDK, and a real Redis).
source "$(dirname "$0")/_setup.sh" "dev"
source "$(dirname "$0")/redis.sh"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy georep adapters
.venv/bin/python -m pytest -p no:cacheprovider "$@"
