#!/usr/bin/env bash
# The demo behind `make run`: a fresh app group, a few producer processes writing concurrently,
# then what the shared store holds. Leaves nothing running.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.build/debug
group=.run/group
rm -rf "$group"
mkdir -p .run

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

echo "== producers: main app (group commit), share extension, widget extension"
"$bin/tributary-sim" app --group "$group" --producer-id app --count 3000 --concurrency 8 >/dev/null & pids+=($!)
"$bin/tributary-sim" extension --group "$group" --producer-id share-extension --count 500 >/dev/null & pids+=($!)
"$bin/tributary-sim" extension --group "$group" --producer-id widget --count 500 --event WidgetRefresh >/dev/null & pids+=($!)
start=$(date +%s.%N)
for p in "${pids[@]}"; do wait "$p"; done
pids=()
end=$(date +%s.%N)
"$bin/tributary" login --group "$group" demo-user >/dev/null
"$bin/tributary" track --group "$group" BuyProduct --properties '{"price": 9.99, "sku": "A-1"}' >/dev/null

echo
echo "== tributary status --group $group"
"$bin/tributary" status --group "$group"
echo
echo "== tributary inspect --group $group --limit 5"
"$bin/tributary" inspect --group "$group" --limit 5
echo
awk -v s="$start" -v e="$end" 'BEGIN { printf "4,000 durable events from 3 processes in %.2f s\n", e - s }'
