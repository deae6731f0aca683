#!/bin/bash
# The system test's runner in the guest (tributary-systest.service). The kernel command line names
# the mode: systest.mode=probe (say so and power off: the host's KVM probe), functional (the units'
# scenarios and the netem rows of network.sh, one after another), load (power loss: producers write,
# the agent uploads, until the host cuts the power; on a disk of its own) or drain (after the last
# cut: wait for the agent to deliver, then judge).
# Each scenario ends in one ROW line on the results port (docs/system-test.md). What the scenarios
# start from (the app's group and users, the groups' stores and settings, the power-loss units) is in
# the image already (fixtures.sh).
set -u
here=/usr/local/lib/tributary-systest
. "$here/lib.sh"
. "$here/scenarios.sh"
. "$here/network.sh"
. "$here/power-loss.sh"

arg() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^systest\.$1=//p"; }
mode=$(arg mode)
log "mode $mode, up $(cut -d' ' -f1 /proc/uptime) s"
case "$mode" in
  probe) say "PROBE ok" ;;
  functional)
    # The netem rows come before the timer, whose first run waits for 2 min of uptime.
    scenarios="start watchdog stop_backlog config_errors journald permissions netem_delay netem_reorder netem_loss timer security"
    # systest.only=a,b runs those alone (SYSTEST_ONLY=a,b make system-test, while iterating).
    [ -z "$(arg only)" ] || scenarios=$(arg only | tr ',' ' ')
    for s in $scenarios; do
      log "scenario $s (CPU busy $(cpu_busy) s)"
      "scenario_$s"
    done
    ;;
  load) power_loss_load "$(arg boot)" ;;
  drain) power_loss_drain "$(arg cuts)" ;;
  *) say "ROW	unknown mode '$mode'	0	-	-	-	-	-	-	-	FAIL" ;;
esac
log "done (CPU busy $(cpu_busy) s)"
say "DONE"
sync
systemctl poweroff
