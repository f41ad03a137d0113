#!/usr/bin/env bash
# The benchmark regression check: the quick form of each benchmark, its ratios against
# benchmarks/results/baseline.json (see benchmarks/check.py). Arguments go to check.py:
#   scripts/bench_check.sh                 check
#   scripts/bench_check.sh --only sender   one benchmark
#   scripts/bench_check.sh --baseline      re-baseline: five quick runs of each benchmark
# Under flock, so that two timed runs on this machine never overlap. Not exec'd: a
# throw-away Redis started by redis.sh is stopped when this shell exits.
source "$(dirname "$0")/_setup.sh" "dev"
source "$(dirname "$0")/redis.sh"
flock /tmp/georep-heavy.lock .venv/bin/python benchmarks/check.py "$@"
