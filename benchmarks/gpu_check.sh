#!/usr/bin/env bash
# Moved to scripts/gpu_check.sh (build and device scripts live in scripts/); kept so the developers' guide's path still works.
exec bash "$(dirname "$0")/../scripts/gpu_check.sh" "$@"
