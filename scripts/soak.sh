#!/usr/bin/env bash
# A randomized fault soak (docs/soak.md): SECONDS of faults of every kind, then the checker.
# Usage: scripts/soak.sh [SECONDS] [SEED] [more `georep soak` options]
# Exit status 1 when a message was lost, processed twice or out of session order, or the
# system did not go quiet; the report is in $GEOREP_SOAK_REPORT (default soak-report/).
# The seed defaults to one that changes every run (printed: replay it with the same SEED).
source "$(dirname "$0")/_setup.sh" "dev"
seconds="${1:-60}"
seed="${2:-$(date +%s)}"
shift $(( $# > 2 ? 2 : $# ))
exec .venv/bin/georep soak --seconds "$seconds" --seed "$seed" --faults all \
    --report "${GEOREP_SOAK_REPORT:-soak-report}" "$@"
