#!/bin/bash
# Reliability scenario 17's rows that need netem (systest.mode=functional): delay with jitter,
# reordering, and delay with loss, put on the guest's loopback with `tc qdisc … netem` (the host's
# kernel has no sch_netem; Debian's cloud kernel ships it). As the host's network rows do
# (Integration/Tests/Reliability/NetworkFaultScenarios.swift), events are stored and delivered on the
# clean link, then as many again and delivered with the fault; the oracle judges both and the row names
# both durations. The clean run is the boot's first row's alone, the baseline of all three (each run
# is a Swift process starting under software emulation). The agent is the installed tributary-fetch@
# unit (a bounded --once run under systemd), against the collector on the loopback.

NG=/var/lib/myapp/net
NINST=$(systemd-escape --path "$NG")
NFETCH="tributary-fetch@$NINST.service"
NOUTBOX="/var/lib/tributary/$NINST/outbox.sqlite"
# Events per run (one on the clean link, one with the fault): 6 batches of 50.
NET_EVENTS=300
NET_BATCH=50
# The loopback during a row: an Ethernet's MTU, and one segment per packet (no GSO: TCP hands lo
# whole writes of up to 64 KiB otherwise, and a batch would pass netem as one packet). A request then
# spans several packets, which netem can delay apart and reorder.
NET_MTU=1500

# The group the rows' fetch runs drain (no long-lived agent ever runs on it), its settings, and the
# rows' agent options, as an operator sets them for one group: batches of 50, the host rows' backoff
# (0.1 s, cap 1 s), a request timeout over any round trip the faults make. Made with the image
# (fixtures.sh).
fixture_network() {
  app_group "$NG"
  echo "TRIBUTARY_AGENT_OPTIONS=--batch-size $NET_BATCH --request-timeout 10 --backoff-base 0.1 --backoff-cap 1" \
    > "/etc/tributary/$NINST.env"
}

# sch_netem loaded, once per boot; the outbox's count of failed attempts before the first row.
net_setup() {
  [ -z "${NET_RETRIES:-}" ] || return 0
  check "modprobe sch_netem" modprobe sch_netem
  log "netem: $(grep -w sch_netem /proc/modules | cut -d' ' -f1-2), $(uname -r)"
  # No fetch run has made the group's outbox yet: no attempt has failed.
  NET_RETRIES=0
}

# One bounded run of the group's tributary-fetch@ unit (systemctl start returns once it exited). Sets
# RUN_SECONDS, what systemctl start took (the process's start, the store's check, the opening, the
# drain and uploads, the exit), and DELIVERY_SECONDS, from the agent's "agent started" to its "agent
# stopped" in the journal (the drain and the uploads alone: under software emulation the debug
# build's start takes seconds of its own).
net_fetch() {
  local status=0 start runs
  runs=$(fetch_runs)
  start=$(date +%s%N)
  systemctl start "$NFETCH" || status=$?
  RUN_SECONDS=$(awk -v s="$start" -v e="$(date +%s%N)" 'BEGIN { printf "%.2f", (e - s) / 1e9 }')
  wait_for 10 "the run's last line in the journal" fetch_ended_after "$runs" || status=1
  # The last run's lines: its "agent started", then its "agent stopped" (runs never overlap).
  DELIVERY_SECONDS=$(fetch_journal | awk -F'[][]' '/agent started/ { s = $2 } /agent stopped/ { e = $2 }
    END { if (s == "" || e == "" || e < s) print "?"; else printf "%.2f", e - s }')
  log "fetch run: ${RUN_SECONDS} s, delivery (agent started to stopped) ${DELIVERY_SECONDS} s, exit $(systemctl show -P ExecMainStatus "$NFETCH")"
  [ "$DELIVERY_SECONDS" != "?" ] || { log "journal: $(fetch_journal | tail -4 | tr '\n' '|')"; status=1; }
  return $status
}

# The fetch runs' journal, with the kernel's monotonic time.
fetch_journal() { journalctl -u "$NFETCH" -o short-monotonic --no-pager; }
# How many runs said "agent stopped"; whether more than N did: fetch_ended_after N
fetch_runs() { fetch_journal | grep -c 'agent stopped'; }
fetch_ended_after() { [ "$(fetch_runs)" -gt "$1" ]; }

# lo's MTU and GSO limits, as `ip link set` takes them: mtu N gso_max_size N gso_max_segs N
lo_settings() { ip -d link show lo | grep -o '\bmtu [0-9]*\|gso_max_size [0-9]*\|gso_max_segs [0-9]*' | tr '\n' ' '; }

# The outbox's count of failed attempts in the text of a `tributary status` (each may have lost one
# acknowledgement: the oracle allows one batch of wire duplicates per retry).
status_retries() { sed -n 's/.*delivered: .* \([0-9]*\) retries.*/\1/p' <<< "$1"; }

# A TcpExt counter of /proc/net/netstat: tcp_ext NAME.
tcp_ext() {
  awk -v k="$1" '$1 == "TcpExt:" { if (!c) { for (i = 2; i <= NF; i++) if ($i == k) c = i } else { print $c; exit } }' \
    /proc/net/netstat
}

# The seconds a TCP connection to the collector takes to open (SYN and SYN-ACK cross the loopback).
connect_time() { curl -s -o /dev/null -w '%{time_connect}' "$COLLECTOR_URL/stats" | awk '{ printf "%.2f", $1 }'; }

# net_row SCENARIO KEY PROOF NETEM_ARGS…: one row. PROOF is what shows the fault acted, besides the
# packets the qdisc passed: "connect>=S" (a connection took S seconds or more to open), "reordered"
# (segments arrived out of order, TcpExtTCPOFOQueue) or "dropped" (netem dropped packets).
net_row() {
  local scenario="$1" key="$2" proof="$3"; shift 3
  local l clean fault r0 r1 ofo0 ofo1 stats status sent dropped connect connect_clean figures lo
  net_setup
  l=$(ledgers "$key")
  collector_start "$key"
  lo=$(lo_settings)
  check "lo: MTU $NET_MTU, one segment a packet" ip link set lo mtu "$NET_MTU" gso_max_size "$NET_MTU" gso_max_segs 1
  log "lo: $lo-> $(lo_settings)"
  # Retries of the row's runs count: its oracle judges their events (the count after the last row's).
  r0=$NET_RETRIES
  if [ -z "${NET_CLEAN:-}" ]; then
    producer "$NG" "$key-clean" "$NET_EVENTS" "$l"
    wait
    check "the clean run succeeds" net_fetch
    NET_CLEAN="clean link $DELIVERY_SECONDS s, the run $RUN_SECONDS s"
    NET_CLEAN_CONNECT=$(connect_time)
    clean="$NET_CLEAN"
  else
    clean="$NET_CLEAN, in the first netem row"
  fi
  connect_clean="$NET_CLEAN_CONNECT"
  producer "$NG" "$key-fault" "$NET_EVENTS" "$l"
  wait
  check "tc qdisc add dev lo root netem $*" tc qdisc add dev lo root netem "$@"
  log "qdisc: $(tc qdisc show dev lo)"
  connect=$(connect_time)
  ofo0=$(tcp_ext TCPOFOQueue)
  check "the run with the fault succeeds" net_fetch
  fault="$DELIVERY_SECONDS s, the run $RUN_SECONDS s"
  ofo1=$(tcp_ext TCPOFOQueue)
  stats=$(tc -s qdisc show dev lo)
  # The fault goes whatever happened, before anything else uses the loopback.
  tc qdisc del dev lo root
  # shellcheck disable=SC2086 # lo's own settings: mtu N gso_max_size N gso_max_segs N
  ip link set lo $lo
  check_eq "lo's own settings are back" "$lo" "$(lo_settings)"
  check "the netem qdisc is removed" sh -c "! tc qdisc show dev lo | grep -q netem"
  # One `tributary status` (a Swift process starting under software emulation) for both questions.
  status=$(tributary status --group "$NG" 2>&1)
  r1=$(status_retries "$status")
  NET_RETRIES=${r1:-$r0}
  sent=$(sed -n 's/.*Sent [0-9]* bytes \([0-9]*\) pkt.*/\1/p' <<< "$stats" | head -1)
  dropped=$(sed -n 's/.*(dropped \([0-9]*\),.*/\1/p' <<< "$stats" | head -1)
  log "netem: $(tr '\n' ' ' <<< "$stats")"
  check "the group is drained (every run delivered everything)" status_drained "$status" || diagnose "$NG" "$NFETCH"
  check "packets went through netem (${sent:-0})" test "${sent:-0}" -gt 0
  case "$proof" in
    connect\>=*) check "a connection took ${proof#connect>=} s or more to open (${connect} s)" \
      awk -v c="$connect" -v m="${proof#connect>=}" 'BEGIN { exit !(c + 0 >= m + 0) }' ;;
    reordered) check "segments arrived out of order ($((ofo1 - ofo0)))" test $((ofo1 - ofo0)) -gt 0 ;;
    dropped) check "netem dropped packets (${dropped:-0})" test "${dropped:-0}" -gt 0 ;;
  esac
  figures="$NET_EVENTS events delivered in $fault ($clean), $((r1 - r0)) retries, connect $connect s (clean"
  figures="$figures $connect_clean s), $((ofo1 - ofo0)) segments out of order, ${dropped:-0} of ${sent:-0} packets dropped"
  row_judged "17 network (VM): $scenario: $figures" 1 --ledger-dir "$l" --group "$NG" --outbox "$NOUTBOX" \
    --batch-size "$NET_BATCH" --in-flight-windows $((r1 - r0))
}

scenario_netem_delay() {
  net_row "300 ms delay, 100 ms jitter (tc netem delay 300ms 100ms on lo)" netem-delay "connect>=0.35" delay 300ms 100ms
}

# netem reorders only with a delay: half the packets, at random, go at once, the rest 100 ms later.
scenario_netem_reorder() {
  net_row "reordering (tc netem delay 100ms reorder 50% on lo)" netem-reorder reordered delay 100ms reorder 50%
}

# 10 % (as the host's random-loss row): at 5 % a run's 70-odd packets all passed one time in 40,
# and the row, which fails unless netem dropped one, with them.
scenario_netem_loss() {
  net_row "100 ms delay, 10 % loss (tc netem delay 100ms loss 10% on lo)" netem-loss dropped delay 100ms loss 10%
}
