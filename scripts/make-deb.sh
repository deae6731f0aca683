#!/bin/sh
# Builds tributary_<version>_amd64.deb from a staged install (make install DESTDIR=STAGE PREFIX=/usr).
# Usage: scripts/make-deb.sh STAGE OUTDIR [VERSION_SUFFIX]
# The binaries carry the Swift runtime, linked statically (--static-swift-stdlib): the package depends
# only on Debian's libraries, which dpkg-shlibdeps finds from the binaries. make deb stages release
# builds; make deb-debug the debug build, its version suffixed +debug.
set -eu
stage="$(cd "$1" && pwd)"
out="$2"
suffix="${3:-}"
here="$(cd "$(dirname "$0")/.." && pwd)"

# Version: 0.<commits>~g<hash> (+dirty when the work tree has changes): increases with every commit.
commits=$(git -C "$here" rev-list --count HEAD 2>/dev/null || echo 0)
hash=$(git -C "$here" rev-parse --short=10 HEAD 2>/dev/null || echo unknown)
dirty=""
git -C "$here" diff --quiet HEAD 2>/dev/null || dirty="+dirty"
version="0.${commits}~g${hash}${dirty}${suffix}"
arch=$(dpkg --print-architecture)

# Debug info off (symbols stay: the Swift backtracer names frames from the symbol table).
for b in "$stage"/usr/bin/*; do strip --strip-debug "$b"; done

# The tributary user and group, made by systemd-sysusers at install (and at every boot, if missing).
install -d "$stage/usr/lib/sysusers.d"
install -m 0644 "$here/Integration/debian/tributary.sysusers" "$stage/usr/lib/sysusers.d/tributary.conf"
install -d "$stage/usr/share/doc/tributary/examples"
install -m 0644 "$here/Integration/systemd/agent.env.example" "$stage/usr/share/doc/tributary/examples/agent.env"

# Maintainer scripts and the package's metadata.
install -d "$stage/DEBIAN"
for s in postinst postrm; do install -m 0755 "$here/Integration/debian/$s" "$stage/DEBIAN/$s"; done
find "$stage/etc" -type f | sed "s|^$stage||" > "$stage/DEBIAN/conffiles"

# Library dependencies from the binaries (dpkg-shlibdeps wants a debian/control beside it).
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/debian"
printf 'Source: tributary\n\nPackage: tributary\nArchitecture: any\n' > "$work/debian/control"
(cd "$work" && dpkg-shlibdeps -O "$stage"/usr/bin/*) > "$work/substvars"
depends="$(sed -n 's/^shlibs:Depends=//p' "$work/substvars"), systemd (>= 247)"
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
sed -e "s|@VERSION@|$version|" -e "s|@ARCH@|$arch|" -e "s|@DEPENDS@|$depends|" -e "s|@SIZE@|$size|" \
  "$here/Integration/debian/control.in" > "$stage/DEBIAN/control"

# gzip -1: the four binaries carry the Swift runtime, Foundation and its ICU data each (about 110 MB
# apiece); xz -6 took minutes on 2 cores for a package a third smaller. dpkg reads zstd from Debian
# 12 on (not 11): the system test's debug package (720 MB unpacked) uses it, DEB_COMPRESSION=zstd,
# packed in 4 s instead of 21 and unpacked in 1 s instead of 8.
mkdir -p "$out"
rm -f "$out"/tributary_*.deb
deb="$out/tributary_${version}_${arch}.deb"
dpkg-deb --root-owner-group "-Z${DEB_COMPRESSION:-gzip}" -z1 --build "$stage" "$deb" >/dev/null
echo "$deb"
