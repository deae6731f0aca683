#!/bin/bash
# Links the debug build's executables again with the Swift runtime inside (-static-stdlib), from the
# objects the last `swift build` left: what make deb-debug packs (make system-test installs it).
# Usage: scripts/static-relink.sh MANIFEST BIN_DIR OUT_DIR PRODUCT…
#   MANIFEST  SwiftPM's build manifest of that build (.build/debug.yaml)
#   BIN_DIR   its products' directory (swift build --show-bin-path)
#   OUT_DIR   where the statically linked PRODUCTs go
# Each link is SwiftPM's own command for the product, read from the manifest, with its output moved
# to OUT_DIR, the static runtime added and lld as the linker (gold took 14 s for the four, lld 6);
# the products link at once. `swift build --static-swift-stdlib --product P`, one product after the
# other, did the same in 45-60 s here: a SwiftPM start and plan each, and the modules it compiled
# again under the changed flags, whose objects then named the static runtime's archives and broke
# the next plain link. This leaves the build as it was.
set -euo pipefail
if [ $# -lt 4 ]; then
  echo "usage: scripts/static-relink.sh MANIFEST BIN_DIR OUT_DIR PRODUCT..." >&2
  exit 64
fi
manifest="$1"
bin_dir="$2"
out="$3"
shift 3
[ -f "$manifest" ] || { echo "static-relink.sh: no build manifest $manifest (build first: swift build)" >&2; exit 66; }

# The debug objects were compiled against the shared Foundation, whose modules do not name the static
# archives it needs: the link names them all, in one group, --as-needed. The group names libcurl for
# every binary and only tributary-sim's demo uses it (URLSession); without --as-needed a binary loads
# 46 libraries instead of 18 (in the system test's emulated guest a start took 0.2-0.5 s more).
static_libs=(-static-stdlib -use-ld=lld -Xlinker --as-needed -Xlinker --start-group)
for lib in FoundationNetworking _CFURLSessionInterface Foundation CoreFoundation FoundationInternationalization \
  _FoundationICU FoundationEssentials _FoundationCShims _FoundationCollections swiftSynchronization curl; do
  static_libs+=(-Xlinker "-l$lib")
done
static_libs+=(-Xlinker --end-group)

# link PRODUCT: SwiftPM's link command for PRODUCT (the manifest's one command that emits an
# executable to BIN_DIR/PRODUCT), its output OUT_DIR/PRODUCT.
link() {
  local product="$1" line args=() i
  line=$(grep -F -- "\"-o\",\"$bin_dir/$product\"" "$manifest" | grep -F '"-emit-executable"' | sed -n 's/^ *args: //p' || true)
  if [ -z "$line" ] || [ "$(wc -l <<< "$line")" -ne 1 ]; then
    echo "static-relink.sh: no single link command for $product in $manifest (build it first: swift build)" >&2
    return 1
  fi
  mapfile -t args < <(jq -r '.[]' <<< "$line")
  for i in "${!args[@]}"; do
    [ "${args[$i]}" != -o ] || args[i + 1]="$out/$product"
  done
  "${args[@]}" "${static_libs[@]}"
}

mkdir -p "$out"
pids=()
for product in "$@"; do
  link "$product" & pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
exit $failed
