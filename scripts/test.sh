#!/usr/bin/env bash
# Run everything CI runs: lint, types, and the whole test suite (unit + integration against
# the local emulator through the real azure-servicebus SDK, and a real Redis).
source "$(dirname "$0")/_setup.sh" "dev"
source "$(dirname "$0")/redis.sh"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy georep adapters
# Most of the suite waits (on the emulator, on outages, on Spark), so it runs on more
# workers than cores. tests/conftest.py makes the units of work (a module, so that its
# emulator or Spark session starts once; or a single test of a long module whose tests are
# independent) and hands out the longest first. GEOREP_TEST_WORKERS=0 runs it in this
# process. Arguments (e.g. a path, -k or -m "not heavy") go to pytest.
# Fourteen is the measured best on two cores (2026-11-28, in place; CPU-seconds busy
# machine-wide): 10 workers took 357 s (542: the waits no longer overlapped), 14 took
# 305-333 s (both cores busy throughout, about 620), 18 took 365 s (719: each worker's
# start, collection and emulators cost more than the overlap won).
# Bytecode is cached (this machine's environment sets PYTHONDONTWRITEBYTECODE): without it
# each of the workers rewrote and compiled every test module again (collection took
# 11 s of CPU per worker instead of 4.6), and every subprocess compiled georep again.
unset PYTHONDONTWRITEBYTECODE
# The suite's Java virtual machines (Spark drivers, a standalone cluster) live seconds and
# handle kilobytes: the client compiler alone and the serial collector halve the CPU they
# take to start (the two Spark modules: 63 s of CPU down to 36 s), and CPU is what two cores
# run short of. The audit's benchmarks run without this.
export JAVA_TOOL_OPTIONS="${JAVA_TOOL_OPTIONS:--XX:TieredStopAtLevel=1 -XX:+UseSerialGC}"
source "$(dirname "$0")/spark_cds.sh"
if [[ "${GEOREP_TEST_WORKERS:-14}" == "0" ]]; then
    exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
fi
# On a fresh clone nothing is compiled yet: each worker would compile georep and rewrite
# every test module itself, fourteen at once. One collection here writes the bytecode once
# (about 3 s); a fresh clone's pytest took 366 s without it and 338 s with it. A module
# that fails to import is reported by the run below, not here.
.venv/bin/python -m pytest -p no:cacheprovider --collect-only -q >/dev/null 2>&1 || true
exec .venv/bin/python -m pytest -p no:cacheprovider -n "${GEOREP_TEST_WORKERS:-14}" \
    --dist-units --no-loadscope-reorder "$@"
