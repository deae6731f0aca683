#!/bin/bash
# The functional scenarios under the real systemd (systest.mode=functional): each one a row of the
# table, judged by the oracle (tributary-sim judge) where events flow, by its checks otherwise.

G=/var/lib/myapp/group
INST=$(systemd-escape --path "$G")
UNIT="tributary-agent@$INST.service"
OUTBOX="/var/lib/tributary/$INST/outbox.sqlite"
# A second group, whose agent meets configuration errors.
CFG=/var/lib/myapp/cfg
CINST=$(systemd-escape --path "$CFG")
CUNIT="tributary-agent@$CINST.service"

# The store and the outbox hold nothing more to send (what `tributary status` says): drained GROUP
# [LEDGER_DIR]. With the ledgers, the collector must first hold as many events as they list (/dev/tcp):
# wait_for asks twice a second, and each `tributary status` is a Swift process starting under software
# emulation, whose CPU the agent being waited for then lacks.
drained() {
  local status
  [ -z "${2:-}" ] || delivered_all "$2" || return 1
  status=$(tributary status --group "$1" 2>/dev/null) || return 1
  status_drained "$status"
}
# Whether the text of a `tributary status` says nothing is left to send: status_drained TEXT
status_drained() { grep -q '^pending events: 0\b' <<< "$1" && grep -q 'outbox: *0 pending' <<< "$1"; }
# Whether it says something is: backlog_left TEXT
backlog_left() { grep -q '^pending events:' <<< "$1" && ! status_drained "$1"; }

# The group as the app's first process leaves it, and the app's settings as it writes them
# (tributary config): the collector, and uploads that do not wait long for a bulk. Made with the
# image (fixtures.sh).
fixture_functional() {
  app_group "$G" flush_interval_seconds=5 flush_bulk_size=100
  make_group "$CFG"
  # The timer's first run comes 2 min after boot, within a random minute: no random delay here.
  mkdir -p /etc/systemd/system/tributary-fetch@.timer.d
  printf '[Timer]\nRandomizedDelaySec=0\n' > /etc/systemd/system/tributary-fetch@.timer.d/systest.conf
}

scenario_start() {
  local l; l=$(ledgers start)
  collector_start start
  local t0; t0=$(date +%s%N)
  check "systemctl enable --now returns 0" systemctl enable --now "$UNIT"
  log "enable --now returned after $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  check_eq "active after READY=1" active "$(systemctl show -P ActiveState "$UNIT")"
  check_eq "sub-state running" running "$(systemctl show -P SubState "$UNIT")"
  local status; status=$(systemctl status --no-pager "$UNIT" 2>&1)
  log "status line: $(echo "$status" | grep 'Status:')"
  check "systemctl status shows the agent's STATUS= line" grep -q 'Status: "' <<< "$status"
  for i in 0 1 2; do producer "$G" "start-$i" 100 "$l"; done
  wait
  check "the agent drains what the producers stored" wait_for 120 "the drain" drained "$G" "$l" || diagnose "$G" "$UNIT"
  # The installed binary has the Swift runtime linked in: its tasks must still have left libdispatch, whose
  # first monitored worker thread (named …-qos) starts a timer that wakes the process once a second. A
  # worker lives 5 s past its last job, and the drain just ended: one used by the uploads is still here.
  local pid; pid=$(systemctl show -P MainPID "$UNIT")
  log "agent threads: $(cat /proc/"$pid"/task/*/comm 2>/dev/null | sort | uniq -c | tr -s ' \n' ' ')"
  check "the agent runs no libdispatch worker thread" sh -c "[ $pid -gt 0 ] && ! cat /proc/$pid/task/*/comm | grep -q -- '-qos\$'"
  row_judged "systemd: start, READY=1, STATUS=, producers as app user" 3 --ledger-dir "$l" --group "$G" --outbox "$OUTBOX"
}

# Whether process PID is gone (reaped): gone PID
gone() { ! kill -0 "$1" 2>/dev/null; }
# Whether the agent was restarted more than BEFORE times and is active again: restarted_since BEFORE
restarted_since() {
  local restarts state
  { read -r restarts; read -r state; } < <(systemctl show -P NRestarts -P ActiveState "$UNIT")
  [ "${restarts:-0}" -gt "$1" ] && [ "$state" = active ]
}

scenario_watchdog() {
  local l; l=$(ledgers watchdog)
  collector_start watchdog
  local before pid restarts
  before=$(systemctl show -P NRestarts "$UNIT")
  # 6 s of events at 50 a second: the agent is frozen 3 s after the producer starts (which itself
  # takes a second or two here), and the rest are stored while it is frozen.
  producer "$G" watchdog-0 300 "$l" --rate 50
  sleep 3
  pid=$(systemctl show -P MainPID "$UNIT")
  # (kill -STOP 0 would stop this runner's own process group.)
  check "the agent has a main process to freeze" test "${pid:-0}" -gt 0 && kill -STOP "$pid"
  log "agent $pid frozen with SIGSTOP (WatchdogSec=30, TimeoutAbortSec=10)"
  # Looked at with the shell's own kill -0 until systemd has ended the process, then with one
  # systemctl a second: each round of a wait is processes starting under software emulation.
  check "systemd ends the frozen agent" wait_for --every 1 90 "the abort" gone "$pid"
  check "systemd restarts the frozen agent" wait_for --every 1 60 "the restart" restarted_since "$before"
  restarts=$(systemctl show -P NRestarts "$UNIT")
  check "the journal says the watchdog fired" sh -c "journalctl -u $UNIT --no-pager | grep -q 'Watchdog timeout'"
  check "a new main process" test "$(systemctl show -P MainPID "$UNIT")" != "$pid"
  wait
  check "the agent drains after the restart" wait_for 120 "the drain" drained "$G" "$l" || diagnose "$G" "$UNIT"
  row_judged "systemd: watchdog aborts a SIGSTOPped agent, restart" 1 --ledger-dir "$l" --group "$G" \
    --outbox "$OUTBOX" --crash-windows $((restarts - before))
}

scenario_stop_backlog() {
  local l; l=$(ledgers stop)
  # The collector holds every request without answering: the stop meets a request in flight.
  collector_start stop --hang-rate 1
  producer "$G" stop-0 150 "$l"
  wait
  check "the collector holds a request" wait_for 60 "a request held" collector_holds_request
  local t0 t1
  t0=$(date +%s)
  systemctl stop "$UNIT"
  t1=$(date +%s)
  log "systemctl stop took $((t1 - t0)) s with a hanging collector"
  check "systemctl stop returns within TimeoutStopSec=30" test $((t1 - t0)) -le 30
  check_eq "a clean stop (Result)" success "$(systemctl show -P Result "$UNIT")"
  check_eq "exit status 0" 0 "$(systemctl show -P ExecMainStatus "$UNIT")"
  local status; status=$(tributary status --group "$G" 2>&1)
  check "the backlog is still there" backlog_left "$status"
  collector_start stop
  check "the next start" systemctl start "$UNIT"
  check "the next start delivers the backlog" wait_for 120 "the drain" drained "$G" "$l" || diagnose "$G" "$UNIT"
  row_judged "systemd: stop with a backlog, hanging collector" 1 --ledger-dir "$l" --group "$G" --outbox "$OUTBOX" \
    --in-flight-windows 1
}

scenario_config_errors() {
  local cfg="$CFG" cinst="$CINST" unit="$CUNIT" fetch="tributary-fetch@$CINST.service"
  # A metrics address no interface has: exit 78, which does not restart.
  echo "TRIBUTARY_AGENT_OPTIONS=--metrics-address 192.0.2.1:9464" > "/etc/tributary/$cinst.env"
  systemctl start "$unit"
  wait_for --every 1 30 "the agent's failure" sh -c "[ \"\$(systemctl is-failed $unit)\" = failed ]"
  check_eq "agent: is-failed" failed "$(systemctl is-failed "$unit")"
  check_eq "agent: exit status 78" 78 "$(systemctl show -P ExecMainStatus "$unit")"
  check_eq "agent: no restart" 0 "$(systemctl show -P NRestarts "$unit")"
  log "journal: $(journalctl -u "$unit" --no-pager -o cat | grep -i metrics | tail -1)"
  check "agent: the journal says why" sh -c "journalctl -u $unit --no-pager -o cat | grep -qi 'metrics'"
  rm "/etc/tributary/$cinst.env"
  # The bounded run with no collector URL and an event to send: exit 78.
  runuser -u app1 -- tributary-sim load --group "$cfg" --producer-id cfg --events 1 2>/dev/null
  systemctl start "$fetch"
  check_eq "fetch: is-failed" failed "$(systemctl is-failed "$fetch")"
  check_eq "fetch: exit status 78" 78 "$(systemctl show -P ExecMainStatus "$fetch")"
  log "journal: $(journalctl -u "$fetch" --no-pager -o cat | grep -i 'url\|server' | tail -1)"
  check "fetch: the journal says why" sh -c "journalctl -u $fetch --no-pager -o cat | grep -qi 'url'"
  systemctl reset-failed "$unit" "$fetch"
  row_checked "systemd: configuration errors (exit 78) do not restart" 2
}

# The agent's lines reach the journal at their own priorities (the sd-daemon prefix, <N>).
scenario_journald() {
  log "info: $(journalctl -u "$UNIT" -p info..info --no-pager -o cat | head -1)"
  check "an agent's info line is at priority info" sh -c "journalctl -u $UNIT -p info..info --no-pager -o cat | grep -q '^tributary-agent: info: '"
  log "err: $(journalctl -u "$CUNIT" -p err --no-pager -o cat | head -2 | tr '\n' ' ')"
  check "the configuration error is at priority err or higher" sh -c "journalctl -u $CUNIT -p err --no-pager -o cat | grep -q ': \(error\|critical\): '"
  check "no error line is stored at info" sh -c "! journalctl -u $CUNIT -u $UNIT -p info..debug --no-pager -o cat | grep -q ': \(error\|critical\): '"
  row_checked "systemd: journald priorities (sd-daemon prefix)" 1
}

scenario_permissions() {
  local pid err code
  err=$(runuser -u stranger -- tributary-sim load --group "$G" --producer-id stranger --events 1 2>&1 >/dev/null)
  code=$?
  log "stranger: exit $code: $err"
  check_eq "a user outside the group cannot track: exit 77" 77 "$code"
  check "with a message naming the group directory" grep -q "$G" <<< "$err"
  check_eq "the outbox's directory is the agent's alone" "700 tributary" "$(stat -c '%a %U' "/var/lib/tributary/$INST")"
  check "the app's user cannot read the outbox" sh -c "! runuser -u app1 -- cat $OUTBOX"
  pid=$(systemctl show -P MainPID "$UNIT")
  # As the agent sees the file system (its mount namespace) and as its user.
  as_agent() { nsenter -t "$pid" -m setpriv --reuid=tributary --regid=tributary --init-groups "$@"; }
  check "the agent writes its group directory" as_agent sh -c "touch $G/.probe && rm $G/.probe"
  check "the agent writes its state directory" as_agent sh -c "touch /var/lib/tributary/$INST/.probe && rm /var/lib/tributary/$INST/.probe"
  check "the agent cannot write /etc" sh -c "! nsenter -t $pid -m setpriv --reuid=tributary --regid=tributary --init-groups touch /etc/.probe"
  check "the agent cannot write beside its group" sh -c "! nsenter -t $pid -m setpriv --reuid=tributary --regid=tributary --init-groups touch /var/lib/myapp/.probe"
  check "the agent cannot write /usr" sh -c "! nsenter -t $pid -m setpriv --reuid=tributary --regid=tributary --init-groups touch /usr/.probe"
  # PrivateTmp=: what it writes in /var/tmp is its own, unseen outside.
  as_agent touch /var/tmp/.probe
  check "the agent's /var/tmp is its own" test ! -e /var/tmp/.probe
  row_checked "systemd: permissions (exit 77, private outbox, confined writes)" 1
}

scenario_timer() {
  local l fetch timer start end
  l=$(ledgers timer)
  collector_start timer
  fetch="tributary-fetch@$INST.service"
  timer="tributary-fetch@$INST.timer"
  # Stopped, not disabled: no boot of this disk follows, and disabling would reload systemd's units.
  systemctl stop "$UNIT"
  producer "$G" timer-0 150 "$l"
  wait
  # The image's drop-in gives the timer no random delay (fixture_functional).
  systemctl start "$timer"
  log "timer: $(systemctl list-timers --no-pager "$timer" | sed -n 2p)"
  local bound=$(( 190 - $(cut -d. -f1 /proc/uptime) )); [ "$bound" -gt 70 ] || bound=70
  check "the timer starts the bounded run, which ends" wait_for "$bound" "the fetch run" \
    sh -c "[ \"\$(systemctl show -P ExecMainExitTimestampMonotonic $fetch)\" -gt 0 ] 2>/dev/null"
  start=$(systemctl show -P ExecMainStartTimestampMonotonic "$fetch")
  end=$(systemctl show -P ExecMainExitTimestampMonotonic "$fetch")
  log "fetch run: $(( (end - start) / 1000000 )) s, exit $(systemctl show -P ExecMainStatus "$fetch")"
  check "within --deadline 50 and TimeoutStartSec=60" test $(( (end - start) / 1000000 )) -le 60
  check_eq "the fetch run succeeded" success "$(systemctl show -P Result "$fetch")"
  systemctl stop "$timer"
  row_judged "systemd: tributary-fetch@.timer's bounded run delivers" 1 --ledger-dir "$l" --group "$G" --outbox "$OUTBOX"
}

# systemd-analyze security on the installed units: the overall exposure, 2.0 or less.
scenario_security() {
  local u score result
  for u in "tributary-agent@$INST.service" "tributary-fetch@$INST.service"; do
    score=$(systemd-analyze security --no-pager "$u" 2>/dev/null | sed -n 's/.*Overall exposure level for .*: \([0-9.]*\) .*/\1/p')
    say "SCORE	${u%%@*}@.service	$score"
    systemd-analyze security --no-pager "$u" 2>/dev/null | grep '✗' | sed 's/^/LOG   /' > "$RESULTS"
    check "exposure of ${u%%@*}@.service $score <= 2.0" awk -v s="$score" 'BEGIN { exit !(s != "" && s <= 2.0) }'
  done
  row_checked "systemd-analyze security: both units <= 2.0" 2
}
