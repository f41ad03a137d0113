#!/usr/bin/env bash
# Run georep's main job on embedded defaults: `georep demo` against a local two-region emulator.
source "$(dirname "$0")/_setup.sh" "emulator,cli,redis,ledger,spark"
exec .venv/bin/georep demo "$@"
