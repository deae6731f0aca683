#!/bin/bash
# Helpers of the system test's guest runner (systest.sh): results out through virtio-serial, the
# collector as a transient unit on the loopback, waits with bounds, checks, and table rows.

RESULTS=/dev/virtio-ports/systest.results
PORT=8900
COLLECTOR_URL="http://127.0.0.1:$PORT"
STATE=/var/lib/systest
mkdir -p "$STATE"

# A line to the host (and the console): results leave the guest as they are written.
say() { echo "$*" > "$RESULTS"; echo "systest: $*" > /dev/console; }
# Log lines carry the guest's uptime: where a run's time goes.
log() { local up _; read -r up _ < /proc/uptime; echo "LOG [$up] $*" > "$RESULTS"; echo "systest: [$up] $*" > /dev/console; }
# The CPU seconds the guest has spent busy since it booted (all CPUs: user, nice, system, interrupts),
# from /proc/stat: with the uptime, whether a scenario's time went on work or on waiting.
cpu_busy() { awk '$1 == "cpu" { printf "%.1f", ($2 + $3 + $4 + $7 + $8) / 100; exit }' /proc/stat; }

# The collector on the loopback, as a transient unit: collector_start NAME [options…]; a new NAME is a
# new database (each scenario judged on its own), the same NAME goes on with the same one.
collector_start() {
  local name="$1"; shift
  systemctl stop systest-collector.service 2>/dev/null || true
  systemctl reset-failed systest-collector.service 2>/dev/null || true
  COLLECTOR_DB="$STATE/$name.sqlite"
  systemd-run --quiet --unit=systest-collector --property=Type=exec \
    /usr/bin/tributary-collector --port "$PORT" --db "$COLLECTOR_DB" "$@"
  wait_for 20 "the collector listening" collector_stats
}
collector_stop() { systemctl stop systest-collector.service; }

# The collector's GET /stats, through bash's own /dev/tcp: the waits ask for it twice a second, and
# under software emulation a curl (a process, its libraries loaded) took 0.4 s of CPU each time, which
# the agent being waited for then lacked. Sets STATS (the body, its JSON); false unless the collector
# answered 200.
collector_stats() {
  local line response=""
  STATS=""
  { exec 3<>"/dev/tcp/127.0.0.1/$PORT"; } 2>/dev/null || return 1
  printf 'GET /stats HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' >&3
  # Each line with its CR (the headers'); the blank line after them is a lone CR.
  while IFS= read -r -t 10 line <&3 || [ -n "$line" ]; do response+="$line"$'\n'; line=""; done
  exec 3<&-
  [[ $response == "HTTP/1.1 200"* ]] || return 1
  STATS=${response#*$'\r\n\r\n'}
}
# The collector's count of unique events (nothing when it does not answer).
collector_unique() {
  collector_stats && [[ $STATS =~ \"unique\"\ *:\ *([0-9]+) ]] && echo "${BASH_REMATCH[1]}"
}

# Whether the collector holds a request without answering it (--hang-rate: its count of hangs).
collector_holds_request() {
  collector_stats && [[ $STATS =~ \"hang\"\ *:\ *([0-9]+) ]] && [ "${BASH_REMATCH[1]}" -gt 0 ]
}

# wait_for [--every S] SECONDS WHAT COMMAND…: runs COMMAND every half second (every S seconds) until
# it succeeds; false after SECONDS. Its clock is bash's SECONDS (a round starts no `date`).
wait_for() {
  local every=0.5
  if [ "$1" = --every ]; then every="$2"; shift 2; fi
  local limit="$1" what="$2"; shift 2
  local end=$(( SECONDS + limit ))
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$end" ]; then log "timed out after ${limit}s waiting for $what"; return 1; fi
    sleep "$every"
  done
}

# The events the ledgers in DIR acknowledged.
acknowledged() { cat "$1"/*.ledger 2>/dev/null | wc -l; }
# Whether the collector holds at least as many unique events as the ledgers in DIR list.
delivered_all() { [ "$(collector_unique)" -ge "$(acknowledged "$1")" ]; }

# Checks of the current scenario: check WHAT COMMAND… records WHAT as failed unless COMMAND succeeds.
FAILED=()
check() {
  local what="$1"; shift
  if "$@" >/dev/null 2>&1; then log "ok: $what"; else log "FAILED: $what"; FAILED+=("$what"); return 1; fi
}
# check_eq WHAT EXPECTED ACTUAL
check_eq() {
  if [ "$2" = "$3" ]; then log "ok: $1 ($3)"; else log "FAILED: $1: expected '$2', got '$3'"; FAILED+=("$1: expected '$2', got '$3'"); fi
}

# row_judged SCENARIO ITERATIONS JUDGE_OPTIONS…: the oracle's row (tributary-sim judge), whose result
# also fails when a check of the scenario failed; the collector is stopped first (its database whole).
row_judged() {
  local scenario="$1" iterations="$2"; shift 2
  local line
  collector_stop
  line=$(tributary-sim judge --scenario "$scenario" --iterations "$iterations" --collector-db "$COLLECTOR_DB" "$@" \
    2>"$STATE/judge.err")
  [ -n "$line" ] || line="$scenario	$iterations	-	-	-	-	-	-	-	FAIL (judge: $(tail -1 "$STATE/judge.err"))"
  log "$(tail -1 "$STATE/judge.err")"
  if [ ${#FAILED[@]} -gt 0 ]; then
    line=$(printf '%s' "$line" | awk -F'\t' -v OFS='\t' -v why="$(IFS=';'; echo "${FAILED[*]}")" '{ $NF = "FAIL (" why ")" } 1')
  fi
  say "ROW	$line"
  FAILED=()
}

# What the agent and the producers said, after a check failed: diagnose GROUP UNIT
diagnose() {
  log "status: $(tributary status --group "$1" 2>&1 | tr '\n' '|')"
  log "journal: $(journalctl -u "$2" --no-pager -o cat -n 8 | tr '\n' '|')"
  log "producers: $(tail -3 "$STATE/producers.err" 2>/dev/null | tr '\n' '|')"
  collector_stats; log "collector: ${STATS:-no answer}"
}

# row_checked SCENARIO ITERATIONS: a row for a scenario judged by its checks alone (no events).
row_checked() {
  local result=pass
  [ ${#FAILED[@]} -eq 0 ] || result="FAIL ($(IFS=';'; echo "${FAILED[*]}"))"
  say "ROW	$1	$2	-	-	-	-	-	-	-	$result"
  FAILED=()
}

# An app's group: its Unix group, a user in it, the directory (2770, set-group-ID) and the agent's
# membership. make_group DIR
make_group() {
  getent group myapp >/dev/null || groupadd myapp
  id app1 >/dev/null 2>&1 || useradd -m -G myapp app1
  id stranger >/dev/null 2>&1 || useradd -m stranger
  id -nG tributary | grep -qw myapp || usermod -a -G myapp tributary
  install -d -m 0755 "$(dirname "$1")"
  install -d -m 2770 -o app1 -g myapp "$1"
}

# A group as the app's first process leaves it, with the app's settings: the collector's URL and
# SETTINGS (tributary config set). app_group DIR [SETTING=VALUE…]
app_group() {
  local dir="$1"; shift
  make_group "$dir"
  # The app's first process creates the store (tributary config needs one).
  runuser -u app1 -- tributary-sim load --group "$dir" --producer-id setup --events 0 >/dev/null
  runuser -u app1 -- tributary config set --group "$dir" "server_url=$COLLECTOR_URL/sa" "$@" >/dev/null
}

# A producer as the app's user: producer GROUP ID EVENTS LEDGER_DIR [load options…] (in the background).
producer() {
  local group="$1" id="$2" events="$3" ledgers="$4"; shift 4
  runuser -u app1 -- tributary-sim load --group "$group" --producer-id "$id" --events "$events" \
    --ledger "$ledgers/$id.ledger" "$@" 2>>"$STATE/producers.err" &
}

# A directory the app's user writes its ledgers to: ledgers NAME
ledgers() { install -d -m 1777 "$STATE/ledgers/$1"; echo "$STATE/ledgers/$1"; }
