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

# each_binary COMMAND…: COMMAND BINARY for the four binaries at once (each run is I/O and one core on
# a 120-185 MB file); fails if one of them failed.
each_binary() {
  pids=""
  for b in "$stage"/usr/bin/*; do "$@" "$b" & pids="$pids $!"; done
  failed=0
  for pid in $pids; do wait "$pid" || failed=1; done
  return $failed
}

# Debug info off (symbols stay: the Swift backtracer names frames from the symbol table), and the
# debug build's .swift_ast (its modules serialized for LLDB's expressions: 36 MB a binary).
each_binary strip --strip-debug --remove-section=.swift_ast

# The tributary user and group, made by systemd-sysusers at install (and at every boot, if missing).
install -d "$stage/usr/lib/sysusers.d"
install -m 0644 "$here/Integration/debian/tributary.sysusers" "$stage/usr/lib/sysusers.d/tributary.conf"
install -d "$stage/usr/share/doc/tributary/examples"
install -m 0644 "$here/Integration/systemd/agent.env.example" "$stage/usr/share/doc/tributary/examples/agent.env"

# Maintainer scripts and the package's metadata.
install -d "$stage/DEBIAN"
for s in postinst postrm; do install -m 0755 "$here/Integration/debian/$s" "$stage/DEBIAN/$s"; done
find "$stage/etc" -type f | sed "s|^$stage||" > "$stage/DEBIAN/conffiles"

# Library dependencies from the binaries (dpkg-shlibdeps wants a debian/control beside it). It reads
# every relocation of a binary (the debug build's have 150,000 each: 20 s for the four in one run),
# so each binary gets a run of its own, all at once; their lists are merged, each library once at the
# highest version any binary needs.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/debian"
printf 'Source: tributary\n\nPackage: tributary\nArchitecture: any\n' > "$work/debian/control"
shlibdeps() {
  (cd "$work" && dpkg-shlibdeps -O "$1" > "$work/${1##*/}.substvars") &&
    sed -n 's/^shlibs:Depends=//p' "$work/${1##*/}.substvars" | tr ',' '\n' > "$work/${1##*/}.deps"
}
each_binary shlibdeps
# Each line "name (>= version)" or a bare name; any other form (alternatives, exact versions) would
# need more than this merge, and stops the build.
if grep -hvE '^ *[a-z0-9][a-z0-9.+-]*( \(>= [^ )]+\))? *$' "$work"/*.deps; then
  echo "make-deb.sh: a dependency of another form than 'name (>= version)' (above)" >&2
  exit 1
fi
depends=""
dep_seen=""
dep_best=""
emit() { [ -z "$dep_seen" ] || depends="${depends:+$depends, }$dep_seen${dep_best:+ (>= $dep_best)}"; }
for entry in $(sed 's/^ *//; s/ *$//; s/ (>= /:/; s/)$//' "$work"/*.deps | sort -u); do
  dep_name=${entry%%:*}
  dep_version=""
  [ "$entry" = "$dep_name" ] || dep_version=${entry#*:}
  if [ "$dep_name" != "$dep_seen" ]; then
    emit
    dep_seen=$dep_name
    dep_best=$dep_version
  elif [ -n "$dep_version" ] && { [ -z "$dep_best" ] || dpkg --compare-versions "$dep_version" gt "$dep_best"; }; then
    dep_best=$dep_version
  fi
done
emit
depends="$depends, systemd (>= 247)"
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
