#!/bin/bash
# Reliability scenario 12, power loss (systest.mode=load, then drain): three producers write while the
# agent uploads, and the host cuts the power (SIGKILL of qemu: what the guest's page cache held is
# lost, what reached the virtual disk stays). Each producer's ledger is a virtio-serial port: an
# acknowledgement leaves the guest as it is written, outside the power domain. After the last cut the
# host boots the guest once more with the ledgers on a second disk (a tar), and the oracle
# judges what the collector, inside the guest, holds.

PG=/var/lib/myapp/power
PINST=$(systemd-escape --path "$PG")
PUNIT="tributary-agent@$PINST.service"

# Made with the image (fixtures.sh): the group, and a collector and the group's agent that systemd
# starts at every boot of the power-loss chain (load and drain boots alone: the functional boot runs
# on a copy of the same image).
fixture_power_loss() {
  app_group "$PG" flush_interval_seconds=5 flush_bulk_size=100
  # Both units start on the power-loss chain's boots alone.
  local only=$'ConditionKernelCommandLine=|systest.mode=load\nConditionKernelCommandLine=|systest.mode=drain'
  local unit=/etc/systemd/system/systest-collector-power.service
  cat > "$unit" <<UNIT
[Unit]
Description=Tributary collector of the power-loss scenario
Before=$PUNIT
$only
[Service]
ExecStart=/usr/bin/tributary-collector --port $PORT --db $STATE/power.sqlite
[Install]
WantedBy=multi-user.target
UNIT
  # The installed unit, as it is, with the power-loss boots' condition on this one instance.
  mkdir -p "/etc/systemd/system/$PUNIT.d"
  printf '[Unit]\n%s\n' "$only" > "/etc/systemd/system/$PUNIT.d/power-loss.conf"
  systemctl enable systest-collector-power.service "$PUNIT"
}

# power_loss_load BOOT: producers pl-BOOT-0..2 write until the host cuts the power. The host times
# the cut from the ledgers it receives (once each producer has acknowledged an event): nothing here
# polls (each command a Swift process starting under software emulation would slow the producers).
power_loss_load() {
  local boot="$1" i
  # This runner starts after basic.target: systemd may still be starting the agent (the cut can come
  # while it recovers what the last one left). Whether it came up is the drain boot's check.
  log "the agent is $(systemctl show -P ActiveState "$PUNIT")"
  # Synchronous track() (one producer) and group-committed track() from 2 and 4 concurrent callers,
  # 40 events a second each (--rate is per caller). At 150 a caller (1,050 a second asked) the
  # producers took both emulated CPUs, and the agent starting beside them came up seconds later.
  local callers
  for i in 0 1 2; do
    chmod 0666 "/dev/virtio-ports/systest.ledger$i"
    callers=$((i * 2))
    runuser -u app1 -- tributary-sim load --group "$PG" --producer-id "pl-$boot-$i" --events 1000000 \
      --rate $((40 / (callers > 0 ? callers : 1))) --concurrency "$callers" \
      --ledger "/dev/virtio-ports/systest.ledger$i" 2>/dev/console &
  done
  say "LOADING"
  # UPLOADING once the collector holds more events than when this boot's first look found: the agent
  # is up and sending (the host cuts either 0.5-3.5 s after the producers' first acknowledgements,
  # which may fall while the agent still starts and recovers, or 0.5-3.5 s after this line). Through
  # bash's /dev/tcp (collector_unique), no process: cheap enough to ask twice a second.
  local before=""
  until [ -n "$before" ]; do before=$(collector_unique); sleep 0.5; done
  until [ "$(collector_unique)" -gt "$before" ] 2>/dev/null; do sleep 0.5; done
  say "UPLOADING"
  sleep infinity
}

# power_loss_drain CUTS: the agent delivers what the cuts left, then the oracle's row.
power_loss_drain() {
  local cuts="$1" l="$STATE/ledgers/power"
  mkdir -p "$l"
  # The ledgers' disk is virtio (its driver a module udev loads while the boot goes on).
  local disk=/dev/disk/by-id/virtio-ledgers
  check "the ledgers' disk appears" wait_for 60 "$disk" test -b "$disk"
  check "the ledgers' disk is read" tar -xf "$disk" -C "$l"
  check "it holds the ledgers of $cuts boots" test "$(ls "$l" | wc -l)" -eq $((3 * cuts))
  log "ledgers: $(ls "$l" | wc -l) files, $(acknowledged "$l") acknowledged events"
  check_eq "the agent is active after the last boot" active "$(systemctl show -P ActiveState "$PUNIT")"
  check "the agent drains what the cuts left" wait_for 240 "the drain" drained "$PG" "$l"
  log "agent: $(systemctl show -P StatusText "$PUNIT")"
  systemctl stop systest-collector-power.service
  COLLECTOR_DB="$STATE/power.sqlite"
  # The producers' callers (--concurrency 0, 2, 4: one, two, four), each writing its own ledger line:
  # when the power went, a caller's line could still be in the guest while a later one had left.
  row_judged "12 power loss (qemu killed), systemd restarts the agent" "$cuts" --ledger-dir "$l" --group "$PG" \
    --outbox "/var/lib/tributary/$PINST/outbox.sqlite" --all-cut --crash-windows "$cuts" \
    --cut-callers 'pl-*-0=1' --cut-callers 'pl-*-1=2' --cut-callers 'pl-*-2=4'
}
