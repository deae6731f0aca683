#!/bin/bash
# make system-test: boots the Debian 12 image (image.sh) under qemu and runs the scenarios of
# docs/system-test.md under the real systemd, then prints their table.
# Usage: Integration/system-test/run.sh DIR CUTS
#   DIR   the image's directory (disk.img, vmlinuz); runs go to DIR/run
#   CUTS  power cuts of the power-loss scenario (make system-test: 10; make soak: 100)
# KVM is used when a short probe boot with it succeeds; otherwise software emulation (TCG).
# A guest that does not boot or hangs fails the run with the tail of its serial console.
# Two chains of boots run side by side, each on its own copy of the image: the functional boot (the
# units' scenarios, much of it waiting on systemd's timers), and the power-loss boots and their drain
# (each a boot under software emulation, CPU-bound); one after the other they took 15-17 min here.
set -uo pipefail
dir="$1"
cuts="$2"
here="$(cd "$(dirname "$0")" && pwd)"
run="$dir/run"
rm -rf "$run"
mkdir -p "$run"
table="$run/table.tsv"
printf 'scenario\titerations\tacknowledged\tdelivered\tlost\twire dups\tdups after dedup\torder violations\tmisattributed\tresult\n' > "$table"
work="$run/disk.img"
cp --sparse=always "$dir/disk.img" "$work"
# The power-loss chain's own disk: its first load boot sets its group, collector and agent up.
power_disk="$run/power.img"

accel=(-accel tcg,thread=multi -cpu max)
accel_name=TCG

# vm NAME MODE TIMEOUT [qemu options…]: one boot of the disk $DISK (default: the functional one), at
# the niceness $VM_NICE (default 0); its console in NAME.console, the results port in NAME.results.
# Returns qemu's status (124 when TIMEOUT ran out).
# A guest whose runner has said nothing $BOOT_LIMIT s after qemu started never got through its
# kernel's boot: it is powered off and booted once more, its console kept as NAME.hung.console. (Once
# in CI, a load boot's kernel stuck at 2 s in its crypto self-tests under TCG, "soft lockup - CPU#0
# stuck for 26s! [cryptomgr_test:50]" every 28 s until the boot's limit; a runner starts 14-30 s
# after qemu.) For a load boot that is one more power cut, before its producers started.
BOOT_LIMIT=${SYSTEST_BOOT_LIMIT:-120}  # SYSTEST_BOOT_LIMIT=5: every first boot counts as hung (to try this path)
vm() {
  local name="$1" mode="$2" limit="$3"; shift 3
  local started=$(date +%s) status attempt job said
  for attempt in 1 2; do
    rm -f "$run/$name.results" "$run/$name.pid"
    # In a subshell whose stderr is dropped: bash's own "Killed" line for a power cut says nothing.
    ( nice -n "${VM_NICE:-0}" timeout --kill-after=5 "$limit" qemu-system-x86_64 "${accel[@]}" -m 1024 -smp 2 -nographic -no-reboot \
      -kernel "$dir/vmlinuz" -append "root=/dev/nvme0n1 rw console=ttyS0 quiet systest.mode=$mode $EXTRA_CMDLINE" \
      -drive "file=${DISK:-$work},format=raw,if=none,id=root,cache=writeback" -device nvme,drive=root,serial=systest -nic none \
      -device virtio-serial -chardev "file,id=results,path=$run/$name.results" \
      -device virtserialport,chardev=results,name=systest.results -pidfile "$run/$name.pid" "$@" \
      > "$run/$name.console" 2>&1 < /dev/null; exit $? ) 2>/dev/null &
    job=$!
    while kill -0 "$job" 2>/dev/null && [ ! -s "$run/$name.results" ] &&
      [ $(( $(date +%s) - started )) -lt "$BOOT_LIMIT" ]; do
      sleep 1
    done
    if [ "$attempt" -eq 1 ] && kill -0 "$job" 2>/dev/null && [ ! -s "$run/$name.results" ]; then
      kill -KILL "$(cat "$run/$name.pid" 2>/dev/null)" 2>/dev/null
      wait "$job" 2>/dev/null
      cp "$run/$name.console" "$run/$name.hung.console"
      said=$(grep -ao '\[ *[0-9]\+\.[0-9]\+\] .*' "$run/$name.console" | tail -1 | tr -d '\r' | cut -c1-120)
      echo "system-test: boot $name: no word from its runner after $BOOT_LIMIT s, its kernel last said: ${said:-nothing}; powered off, booting it once more"
      started=$(date +%s)
      continue
    fi
    wait "$job"
    status=$?
    break
  done
  echo "system-test: boot $name ($mode): $(( $(date +%s) - started )) s, qemu status $status"
  return $status
}
EXTRA_CMDLINE=""

# fail WHY NAME: the tail of the boot's serial console, then exit 1 (a boot still running in the
# background is powered off first).
fail() {
  # Still running while it has no status file (its process id alone may have been reused: below).
  [ -z "${functional_job:-}" ] || [ -e "$run/functional.status" ] ||
    kill -KILL "$(cat "$run/functional.pid" 2>/dev/null)" 2>/dev/null
  echo "system-test: $1" >&2
  echo "--- last lines of the serial console ($run/$2.console) ---" >&2
  tail -40 "$run/$2.console" >&2
  exit 1
}

# KVM when a probe boot with it succeeds: on some hosts KVM stops on the guest kernel at once.
if [ -w /dev/kvm ]; then
  accel=(-enable-kvm -cpu host)
  if vm probe-kvm probe 60 && grep -q "PROBE ok" "$run/probe-kvm.results"; then
    accel_name=KVM
  else
    echo "system-test: KVM probe failed ($(grep -m1 -i 'error' "$run/probe-kvm.console" || echo 'no answer')): TCG"
    accel=(-accel tcg,thread=multi -cpu max)
    cp --sparse=always "$dir/disk.img" "$work"
  fi
fi
echo "system-test: accelerator $accel_name"

rows() { sed -n 's/^ROW\t//p' "$run/$1.results" >> "$table"; }

total_start=$(date +%s)
# The functional boot, in the background while the power-loss chain runs; its rows come first.
# Its status goes to a file: bash forgets a finished background job's status once its process id is
# used again, and with a pid_max of 32768 the cut loop's many short processes wrap the ids (after 100
# load boots, `wait` said the functional boot was no child of this shell).
# It runs at a lower priority (nice 2): the power-loss chain is CPU-bound throughout, and much of the
# functional boot waits on systemd's timers (the two chains took about 490 s each in CI).
( EXTRA_CMDLINE="${SYSTEST_ONLY:+systest.only=$SYSTEST_ONLY}" VM_NICE=2 vm functional functional 900
  echo $? > "$run/functional.status" ) &
functional_job=$!

# functional_rows: waits for the functional boot, then its rows and security scores (or fails the run).
functional_rows() {
  wait "$functional_job" 2>/dev/null  # its status is in the file, however long ago it ended
  [ "$(cat "$run/functional.status" 2>/dev/null)" = 0 ] || fail "the functional boot failed or timed out" functional
  grep -q '^DONE' "$run/functional.results" || fail "the functional boot did not finish its scenarios" functional
  rows functional
  sed -n 's/^SCORE\t//p' "$run/functional.results" | while IFS=$'\t' read -r unit score; do
    echo "system-test: systemd-analyze security $unit: $score"
  done
}

# The table, and the run's status: a failed row fails it (the table script's own status is only about
# skipped rows).
finish() {
  "$here/../../scripts/reliability-table.sh" "$table" || exit 1
  ! awk -F'\t' 'NR > 1 && $NF ~ /^FAIL/ { found = 1 } END { exit !found }' "$table" || {
    echo "system-test: a scenario failed (its row, and $run/*.results)" >&2
    exit 1
  }
  exit 0
}

if [ "$cuts" -eq 0 ]; then functional_rows; finish; fi
cp --sparse=always "$dir/disk.img" "$power_disk"
DISK="$power_disk"
# Power loss: each load boot starts the producers, and the power goes 0.5-3.5 s after they do.
ledgers="$run/ledgers"
mkdir -p "$ledgers"
for boot in $(seq 1 "$cuts"); do
  ports=()
  for i in 0 1 2; do
    ports+=(-chardev "file,id=ledger$i,path=$ledgers/pl-$boot-$i.ledger" -device "virtserialport,chardev=ledger$i,name=systest.ledger$i")
  done
  EXTRA_CMDLINE="systest.boot=$boot" vm "load-$boot" load 300 "${ports[@]}" &
  qemu_job=$!
  # The power goes 0.5-3.5 s after every producer has acknowledged an event (its ledger has a line): on
  # odd boots at once (the agent may still be starting and recovering), on even boots once the guest
  # says the agent uploads (the collector got new events).
  when="the producers' first acknowledgements"
  [ $((boot % 2)) -eq 1 ] || when="$when and the agent's first upload"
  until [ "$(grep -l . "$ledgers"/pl-"$boot"-*.ledger 2>/dev/null | wc -l)" -eq 3 ] &&
    { [ $((boot % 2)) -eq 1 ] || grep -q '^UPLOADING' "$run/load-$boot.results"; }; do
    # 240 s from its qemu's start (the second qemu's, when vm booted the guest again: its pid file is new).
    qemu_started=$(stat -c %Y "$run/load-$boot.pid" 2>/dev/null || date +%s)
    if ! kill -0 "$qemu_job" 2>/dev/null || [ "$(date +%s)" -ge $(( qemu_started + 240 )) ]; then
      kill -KILL "$(cat "$run/load-$boot.pid" 2>/dev/null)" 2>/dev/null; wait "$qemu_job"
      fail "load boot $boot: not cut after 240 s, no $when" "load-$boot"
    fi
    sleep 0.2
  done
  tenths=$(( RANDOM % 31 + 5 ))
  cut_after="$(( tenths / 10 )).$(( tenths % 10 ))"
  sleep "$cut_after"
  kill -KILL "$(cat "$run/load-$boot.pid")" || fail "could not cut the power of load boot $boot" "load-$boot"
  wait "$qemu_job"
  rows "load-$boot"
  # A line the guest was writing when the power went is no acknowledgement: drop an unfinished last line.
  for f in "$ledgers"/pl-"$boot"-*.ledger; do
    [ -z "$(tail -c1 "$f")" ] || sed -i '$d' "$f"
  done
  echo "system-test: power cut $boot/$cuts, $cut_after s after $when, $(( $(date +%s) - $(stat -c %Y "$run/load-$boot.pid") )) s after qemu started: $(cat "$ledgers"/pl-"$boot"-*.ledger | wc -l) events acknowledged in this boot"
done
# The ledgers reach the guest on a second disk: a tar, padded to whole sectors, its serial number
# "ledgers" (/dev/disk/by-id/virtio-ledgers).
tar -cf "$run/ledgers.tar" -C "$ledgers" . && truncate -s %512 "$run/ledgers.tar"
EXTRA_CMDLINE="systest.cuts=$cuts" vm drain drain 400 \
  -drive "file=$run/ledgers.tar,format=raw,if=none,id=ledgers,readonly=on" -device virtio-blk-pci,drive=ledgers,serial=ledgers
drained=$?
functional_rows
[ "$drained" -eq 0 ] || fail "the drain boot failed or timed out" drain
grep -q '^DONE' "$run/drain.results" || fail "the drain boot did not finish" drain
rows drain

echo "system-test: $accel_name, scenarios and $cuts power cuts in $(( $(date +%s) - total_start )) s"
finish
