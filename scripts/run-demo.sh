#!/usr/bin/env bash
# The demo behind `make run`: collector, agent and producer processes on loopback, end to end.
# Everything it starts is stopped before it returns.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .run
exec .build/debug/tributary-sim demo --group .run/group "$@"
