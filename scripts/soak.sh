#!/usr/bin/env bash
# A randomized fault soak (docs/soak.md): SECONDS of faults of every kind, then the checker.
# Usage: scripts/soak.sh [SECONDS] [SEED|random] [more `georep soak` options]
# Exit status 1 when a message was lost, processed twice or out of session order, or the
# system did not go quiet; the report is in $GEOREP_SOAK_REPORT (default soak-report/).
# CI runs the default seed, so that a red run replays as it ran; `random` explores a new
# schedule (the seed is printed: replay it by giving it back).
source "$(dirname "$0")/_setup.sh" "dev"
seconds="${1:-60}"
seed="${2:-28}"
if [[ "$seed" == "random" ]]; then
    seed="$(date +%s)"
fi
shift $(( $# > 2 ? 2 : $# ))
unset PYTHONDONTWRITEBYTECODE  # its workers start and restart often: compile once
exec .venv/bin/georep soak --seconds "$seconds" --seed "$seed" --faults all \
    --report "${GEOREP_SOAK_REPORT:-soak-report}" "$@"
