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
# worker. GEOREP_TEST_WORKERS=0 runs it in this process. The modules marked heavy (many
# processes, or long runs timed against an outage) run after the rest, two at a time: on a
# 2-core machine six workers starve their timing. Arguments (e.g. a path or -k) go to both.
if [[ "${GEOREP_TEST_WORKERS:-6}" == "0" ]]; then
    exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
fi
status=0
.venv/bin/python -m pytest -p no:cacheprovider -n "${GEOREP_TEST_WORKERS:-6}" --dist loadfile \
    -m "not heavy" "$@" || status=$?
heavy=0
.venv/bin/python -m pytest -p no:cacheprovider -n 2 --dist loadfile -m heavy "$@" || heavy=$?
# Exit 5 is "no test selected" (arguments that name no heavy module, or only heavy ones).
if [[ $status -eq 5 && $heavy -ne 5 ]]; then status=0; fi
if [[ $heavy -ne 0 && $heavy -ne 5 ]]; then status=$heavy; fi
if [[ $status -eq 5 && $heavy -eq 5 ]]; then status=5; fi
exit "$status"
