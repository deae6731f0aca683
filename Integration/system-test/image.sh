#!/bin/sh
# Builds the system test's Debian 12 disk image: DIR/disk.img and DIR/vmlinuz, its kernel.
# Usage: Integration/system-test/image.sh DIR DEB
#        Integration/system-test/image.sh --base DIR   (the base alone: make system-test builds it
#        while the .deb is made)
#
# Two caches, both under DIR:
# - base-<hash>.tar: the root filesystem from Debian's packages (mmdebstrap), keyed by the package
#   list and the suite; made once (about a minute), reused until the list changes.
# - disk.img: the base with DEB installed (apt-get install ./tributary_*.deb inside the image, whose
#   dependencies the base holds already: no network needed) and the guest's test files; keyed by the
#   base, the .deb's checksum and the guest files.
set -eu
base_only=""
if [ "$1" = --base ]; then base_only=1; shift; fi
dir="$1"
deb="${2:-}"
here="$(cd "$(dirname "$0")" && pwd)"
suite=bookworm
mkdir -p "$dir"

packages=$(grep -v '^#' "$here/packages" | tr -s ' \n' ',' | sed 's/,$//')
# The guest boots its kernel with no initrd (below), so none is made: update-initramfs is diverted to
# a stub before the kernel's package is configured (Debian generated one twice, 17 of the base's 45 s).
no_initrd='set -e
chroot "$1" dpkg-divert --quiet --local --rename --divert /usr/sbin/update-initramfs.distrib --add /usr/sbin/update-initramfs
printf "#!/bin/sh\n# The system test boots its kernel with no initrd (Integration/system-test/image.sh).\nexit 0\n" > "$1/usr/sbin/update-initramfs"
chmod 0755 "$1/usr/sbin/update-initramfs"'
base_key=$(printf '%s %s %s' "$suite" "$packages" "$no_initrd" | sha256sum | cut -c1-16)
base="$dir/base-$base_key.tar"
if [ ! -s "$base" ]; then
  echo "system-test: building the root filesystem ($suite: $packages)"
  start=$(date +%s)
  rm -f "$dir"/base-*.tar
  mmdebstrap --quiet --variant=apt --include="$packages" --essential-hook="$no_initrd" \
    --customize-hook='echo tributary-systest > "$1/etc/hostname"' \
    --customize-hook='chroot "$1" passwd -d root' \
    "$suite" "$dir/partial-base.tar"
  mv "$dir/partial-base.tar" "$base"
  echo "system-test: root filesystem built in $(( $(date +%s) - start )) s"
fi

[ -z "$base_only" ] || exit 0

image_key=$( (echo "$base_key"; sha256sum "$deb" | cut -d' ' -f1; cat "$here"/guest/*) | sha256sum | cut -c1-16)
if [ -s "$dir/disk.img" ] && [ "$(cat "$dir/disk.key" 2>/dev/null)" = "$image_key" ]; then
  echo "system-test: disk image up to date ($image_key)"
  exit 0
fi
start=$(date +%s)
root="$dir/root"
# A run cut short may have left the image's /proc mounted: never remove beneath it.
umount "$root/proc" 2>/dev/null || true
rm -rf --one-file-system "$root" "$dir/disk.img" "$dir/disk.key"
mkdir -p "$root"
tar -xf "$base" -C "$root"
# Installed the way a Debian user installs it; the dependencies are in the image already.
cp "$deb" "$root/tmp/"
chroot "$root" sh -c 'DEBIAN_FRONTEND=noninteractive apt-get install -y -q /tmp/tributary_*.deb' \
  > "$dir/install.log" 2>&1 || { tail -20 "$dir/install.log"; echo "system-test: installing the .deb failed" >&2; exit 1; }
rm -f "$root"/tmp/tributary_*.deb
# The guest's test runner, started after multi-user.target when the kernel command line names a mode.
install -d "$root/usr/local/lib/tributary-systest"
install -m 0755 "$here"/guest/*.sh "$root/usr/local/lib/tributary-systest/"
for u in tributary-systest.service tributary-systest-load.service; do
  install -m 0644 "$here/guest/$u" "$root/etc/systemd/system/"
  ln -sf "/etc/systemd/system/$u" "$root/etc/systemd/system/multi-user.target.wants/"
done
# Units a test boot does without, masked: each took up to 2 s of every boot under TCG. No login
# prompts (nobody logs in; the console shows the boot and the runner's lines only), no utmp, no
# modules nobody uses, no daily maintenance timers.
for u in serial-getty@ttyS0.service getty@.service getty-static.service systemd-update-utmp.service \
  systemd-update-utmp-runlevel.service modprobe@dm_mod.service modprobe@efi_pstore.service modprobe@fuse.service \
  modprobe@loop.service sys-fs-fuse-connections.mount apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer \
  fstrim.timer e2scrub_all.timer; do
  ln -sf /dev/null "$root/etc/systemd/system/$u"
done
# Generators a test boot does without, masked: systemd runs each at every boot and reload (about 2 s
# of the first boot under TCG). The fstab generator stays.
install -d "$root/etc/systemd/system-generators"
for g in cryptsetup debug getty gpt-auto hibernate-resume integritysetup rc-local run system-update sysv \
  veritysetup; do
  ln -sf /dev/null "$root/etc/systemd/system-generators/systemd-$g-generator"
done
# What the scenarios start from (guest/fixtures.sh): made here, by the installed binaries, as in the guest.
mount -t proc proc "$root/proc"
chroot "$root" /usr/local/lib/tributary-systest/fixtures.sh > "$dir/fixtures.log" 2>&1 || status=$?
umount "$root/proc"
[ "${status:-0}" -eq 0 ] || { tail -20 "$dir/fixtures.log"; echo "system-test: the guest's fixtures failed" >&2; exit 1; }
# The root file system is an NVMe disk: the cloud kernel has its driver (and ext4) built in, so the
# guest boots with no initrd (unpacking it and its udev took seconds of every boot under TCG).
echo "/dev/nvme0n1 / ext4 rw,errors=remount-ro 0 1" > "$root/etc/fstab"
cp "$root"/boot/vmlinuz-* "$dir/vmlinuz"
mkfs.ext4 -q -F -L root -d "$root" "$dir/disk.img" 2G
rm -rf --one-file-system "$root"
echo "$image_key" > "$dir/disk.key"
echo "system-test: disk image built in $(( $(date +%s) - start )) s ($image_key)"
