#!/usr/bin/env bash
# Stop latency of tributary-agent under load: N SIGTERMs (default 100) at random moments while a
# producer writes and the collector answers slowly; prints p50, p99 and max from SIGTERM to exit.
# Part of `make bench`; uses the release binaries in $1 (default .build-release/release).
set -euo pipefail
bin=${1:-.build-release/release}
n=${STOP_BENCH_ROUNDS:-100}
work=$(mktemp -d /var/tmp/tributary-stop.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

"$bin/tributary-collector" --port 0 --latency-ms 100 --hang-rate 0.2 --seed 7 >"$work/collector.out" 2>/dev/null &
pids+=($!)
for _ in $(seq 100); do grep -q LISTENING "$work/collector.out" 2>/dev/null && break; sleep 0.05; done
url=$(awk '/LISTENING/ {print $2}' "$work/collector.out")
"$bin/tributary-sim" load --group "$work/group" --count 10000000 --interval-ms 1 >/dev/null 2>&1 &
pids+=($!)
sleep 0.3

: >"$work/latencies"
failures=0
for i in $(seq "$n"); do
  "$bin/tributary-agent" --group "$work/group" --server "$url/sa" --outbox "$work/outbox.sqlite" \
    --stop-timeout 2 --bulk-size 10 --batch-size 50 --log-level error &
  agent=$!
  sleep "0.$(printf '%03d' $((RANDOM % 800 + 200)))"
  start=$(date +%s%N)
  kill -TERM "$agent"
  status=0; wait "$agent" || status=$?
  end=$(date +%s%N)
  [ "$status" -eq 0 ] || failures=$((failures + 1))
  echo $(( (end - start) / 1000 )) >>"$work/latencies"
done
sort -n "$work/latencies" | awk -v n="$n" -v f="$failures" '
  { v[NR] = $1 }
  END {
    p50 = v[int((NR + 1) * 0.50)]; p99 = v[int(NR * 0.99 + 0.999)]; if (p99 == "") p99 = v[NR]
    printf "stop latency after SIGTERM (--stop-timeout 2, %d rounds under load): p50 %.3f s, p99 %.3f s, max %.3f s; non-zero exits: %d\n",
      NR, p50 / 1e6, p99 / 1e6, v[NR] / 1e6, f
  }'
