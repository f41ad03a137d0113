#!/usr/bin/env bash
# The benchmark regression check: the quick form of each benchmark, its ratios against
# benchmarks/results/baseline.json (see benchmarks/check.py). Arguments go to check.py:
#   scripts/bench_check.sh                 check (CI runs this after the tests)
#   scripts/bench_check.sh --baseline      re-baseline: five quick runs of each benchmark
# Under flock, so that two timed runs on this machine never overlap.
set -euo pipefail
cd "$(dirname "$0")/.."
exec flock /tmp/georep-heavy.lock .venv/bin/python benchmarks/check.py "$@"
