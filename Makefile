# Tributary — `make run` runs the demo pipeline, `make test` runs every test.
# Both install what a fresh Debian machine lacks first (`make deps`).

SWIFT        ?= swift
PREFIX       ?= /usr/local
DESTDIR      ?=
RELEASE_DIR  := .build-release
# Debian packages the build and tests need (C libraries wrapped as .systemLibrary targets).
# systemd gives systemd-analyze (unit checks); chromium the hybrid-page browser. (The clock-jump tests shift
# the wall clock through TRIBUTARY_TEST_WALL_CLOCK_OFFSET_FILE: libfaketime's LD_PRELOAD breaks Swift binaries.)
# strace injects ENOSPC/EIO into the agent's writes and fsyncs (docs/reliability.md).
# libcurl4-openssl-dev: release binaries link Foundation statically, whose URLSession (tributary-sim's demo) needs libcurl.
# tinyproxy (its binary alone) is the real HTTP proxy the proxy tests send through (docs/operations.md).
# iproute2 (ip netns, veth, tc tbf) and nftables (drops, resets, random loss) make the network-namespace
# fault rows (docs/reliability.md, scenario 17).
DEB_PACKAGES := liblmdb-dev zlib1g-dev libdeflate-dev libsqlite3-dev libsystemd-dev libcurl4-openssl-dev pkg-config systemd chromium strace tinyproxy-bin iproute2 nftables
SYSCONFDIR   ?= /etc
UNITDIR      ?= $(PREFIX)/lib/systemd/system
DOCDIR       ?= $(PREFIX)/share/doc/tributary
BINARIES     := tributary tributary-agent tributary-collector tributary-sim
# Release binaries carry the Swift runtime (linked statically): the .deb needs only Debian's libraries.
RELEASE_FLAGS := -c release --static-swift-stdlib --scratch-path $(RELEASE_DIR)
# The .deb (make deb) and the system test's image and runs (make system-test, docs/system-test.md).
DEB_DIR      := .build-deb
# The package the system test installs by default: the same code built by `swift build` (debug, the
# build `make test` made) and linked again with the Swift runtime inside (-static-stdlib), made in
# under a minute where a release build from nothing takes 15-30 (docs/system-test.md, "Times").
# SYSTEST_BUILD=release tests the release package of `make deb` instead (make soak does).
DEB_DEBUG_DIR := .build-deb-debug
SYSTEST_BUILD ?= debug
SYSTEST_DIR  := .build-system
# Power cuts of the system test's power-loss scenario (make soak: 100).
SYSTEST_CUTS ?= 10
# What make system-test needs besides make deps: the image builder, the virtual machine, mkfs.ext4 -d,
# dpkg-shlibdeps (the .deb's dependencies), strip, and jq (the debug build's link commands).
SYSTEST_DEB_PACKAGES := mmdebstrap qemu-system-x86 e2fsprogs dpkg-dev binutils jq

.PHONY: all deps bench-deps build test soak run bench clean format help install release deb deb-debug system-test system-test-base system-test-deps

all: build

help:
	@echo "make deps   install missing system packages ($(DEB_PACKAGES))"
	@echo "make build  debug build of every target"
	@echo "make test   build and run every test (unit and multi-process), then print the reliability table"
	@echo "make soak   the reliability scenarios only, SOAK (default 20) times the iterations; then make system-test with 100 power cuts"
	@echo "make deb    release build, then $(DEB_DIR)/tributary_<version>_amd64.deb (dpkg-deb)"
	@echo "make deb-debug  the same package from the debug build (relinked with the Swift runtime inside): $(DEB_DEBUG_DIR)/"
	@echo "make system-test  the .deb (make deb-debug; SYSTEST_BUILD=release: make deb) installed in a Debian 12 virtual machine: the units under the real systemd, power loss ($(SYSTEST_CUTS) cuts)"
	@echo "make system-test-deps  the packages make system-test needs besides make deps ($(SYSTEST_DEB_PACKAGES))"
	@echo "make run    demo: a collector, an agent, a main app, two extensions, a hybrid page and a crashing app session on a fresh group, then a summary"
	@echo "make bench  release build, then every performance figure next to its baseline (docs/performance.md)"
	@echo "make install  release build if needed; binaries, systemd units and docs under DESTDIR/PREFIX"
	@echo "make release  release build of the four binaries into $(RELEASE_DIR)/release"
	@echo "make bench-deps  the packages make bench needs besides make deps ($(BENCH_DEB_PACKAGES))"
	@echo "make format   swift format every source, test and benchmark file in place"
	@echo "make clean    remove every build directory, the bench venv and the demo's files"

# Installs the Debian packages of $(1) that are missing. Idempotent: a quick no-op when all are installed.
# $(2): more apt-get options (--no-install-recommends).
install_missing = missing=""; for p in $(1); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=""; [ "$$(id -u)" -eq 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(2) $$missing; \
	fi

deps:
	@$(call install_missing,$(DEB_PACKAGES))
	@command -v $(SWIFT) >/dev/null 2>&1 || { echo "make: '$(SWIFT)' not found: install a Swift 6.2 or later toolchain (swift.org/install) or set SWIFT=/path/to/swift" >&2; exit 1; }

# Tools only the benchmarks need, never `make test`: python3-venv for the Python SDKs of the loss
# comparison; linux-perf and valgrind to profile (docs/performance.md, "Profiling"); openssl makes the
# certificates of the end-to-end runs over TLS, and curl reads their collector's /stats.
BENCH_DEB_PACKAGES := python3-venv linux-perf valgrind openssl curl
BENCH_DIR          := .build-bench
# The Python SDKs the loss comparison runs, pinned so that reruns compare the same code.
BENCH_PYPI         := segment-analytics-python==2.4.0 posthog==7.91.1

bench-deps: deps
	@$(call install_missing,$(BENCH_DEB_PACKAGES))

$(BENCH_DIR)/venv/.installed: Makefile
	python3 -m venv $(BENCH_DIR)/venv
	$(BENCH_DIR)/venv/bin/pip install --quiet $(BENCH_PYPI)
	touch $@

build: deps
	$(SWIFT) build

# The reliability scenarios append one row each to RELIABILITY_TABLE; the table is printed even when
# tests fail, and the target's status stays the tests' status.
RELIABILITY_TABLE := $(CURDIR)/.build/reliability/table.tsv
SOAK ?= 20
# How many test cases run at once: twice the CPUs. Swift Testing starts every test at once by default;
# on 2 cores the 300-odd tests, many of them starting real processes, then starve each other for the
# first half minute (trivial tests took 13 s, in-process agents missed 20 s deadlines), and tests that
# bound a real agent's stop or deadline failed by timing alone. With 4 at a time on 2 cores the suite
# takes no longer (130 s against 128–146 s) and spends a quarter less CPU. Plain `swift test` still
# runs them all at once.
TEST_WIDTH ?= $(shell echo $$(( 2 * $$(nproc) )))
TEST_ENV := SWT_EXPERIMENTAL_MAXIMUM_PARALLELIZATION_WIDTH=$(TEST_WIDTH)
test: deps
	@rm -f "$(RELIABILITY_TABLE)"
	@$(TEST_ENV) TRIBUTARY_RELIABILITY_REPORT="$(RELIABILITY_TABLE)" $(SWIFT) test; status=$$?; \
	  ./scripts/reliability-table.sh "$(RELIABILITY_TABLE)" || status=1; exit $$status

soak: deps
	@rm -f "$(RELIABILITY_TABLE)"
	@$(TEST_ENV) TRIBUTARY_SOAK=$(SOAK) TRIBUTARY_RELIABILITY_REPORT="$(RELIABILITY_TABLE)" $(SWIFT) test --filter 'Scenarios'; \
	  status=$$?; ./scripts/reliability-table.sh "$(RELIABILITY_TABLE)" || status=1; \
	  $(MAKE) system-test SYSTEST_CUTS=100 SYSTEST_BUILD=release || status=1; exit $$status

run: build
	./scripts/run-demo.sh

# Every figure of docs/performance.md next to its baseline, then one summary table (also written to
# .build-bench/results.txt); then the stop-latency distribution. One product per `swift build`:
# given several --product options, swift build builds only the last. TRIBUTARY_BENCH=1 adds the
# benchmark targets to the package (Package.swift), which `make test` never builds.
BENCH_PRODUCTS := tributary-bench lmdb-baseline tributary-agent tributary-collector tributary-sim
bench: bench-deps $(BENCH_DIR)/venv/.installed
	for p in $(BENCH_PRODUCTS); do \
	  TRIBUTARY_BENCH=1 $(SWIFT) build $(RELEASE_FLAGS) --product $$p || exit 1; done
	$(RELEASE_DIR)/release/tributary-bench all --bin $(RELEASE_DIR)/release \
	  --python $(BENCH_DIR)/venv/bin/python > $(BENCH_DIR)/results.txt && cat $(BENCH_DIR)/results.txt
	./scripts/bench-stop.sh $(RELEASE_DIR)/release

# One product per `swift build`: given several --product options it builds only the last.
release: deps
	for b in $(BINARIES); do $(SWIFT) build $(RELEASE_FLAGS) --product $$b || exit 1; done

# Honours PREFIX (default /usr/local), DESTDIR (staging), SYSCONFDIR, UNITDIR and DOCDIR. Build as yourself
# (`make release`), then `sudo make install`: as root, install builds only when a binary is missing, so a
# root-owned $(RELEASE_DIR) does not get in the way of your next build.
ROOT_WITH_BINARIES := $(and $(filter 0,$(shell id -u)),$(filter $(words $(BINARIES)),$(words $(wildcard $(addprefix $(RELEASE_DIR)/release/,$(BINARIES))))))
# BUILT: the directory the binaries come from (make deb-debug stages the debug build's).
BUILT ?= $(RELEASE_DIR)/release
install: $(if $(or $(ROOT_WITH_BINARIES),$(filter-out $(RELEASE_DIR)/release,$(BUILT))),,release)
	install -d "$(DESTDIR)$(PREFIX)/bin" "$(DESTDIR)$(UNITDIR)" "$(DESTDIR)$(DOCDIR)" "$(DESTDIR)$(SYSCONFDIR)/tributary"
	for b in $(BINARIES); do install -m 0755 "$(BUILT)/$$b" "$(DESTDIR)$(PREFIX)/bin/$$b"; done
	for u in Integration/systemd/*.in; do \
	  sed -e 's|@BINDIR@|$(PREFIX)/bin|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' -e 's|@DOCDIR@|$(DOCDIR)|g' "$$u" \
	    > "$(DESTDIR)$(UNITDIR)/$$(basename "$$u" .in)"; chmod 0644 "$(DESTDIR)$(UNITDIR)/$$(basename "$$u" .in)"; \
	done
	install -m 0644 Integration/systemd/tributary-fetch@.timer "$(DESTDIR)$(UNITDIR)/"
	install -m 0644 docs/*.md README.md CHANGELOG.md "$(DESTDIR)$(DOCDIR)/"
	test -e "$(DESTDIR)$(SYSCONFDIR)/tributary/agent.env" || \
	  install -m 0640 Integration/systemd/agent.env.example "$(DESTDIR)$(SYSCONFDIR)/tributary/agent.env"

# A Debian package of the release build: binaries in /usr/bin, units in /usr/lib/systemd/system, the
# tributary user by sysusers.d, docs and an example environment file (docs/operations.md, "Install").
deb: release system-test-deps
	$(call make_deb,$(RELEASE_DIR)/release,$(DEB_DIR),)

# The same package from the debug build (what make system-test installs by default; a release build
# from nothing takes 15-30 min here): the four binaries linked again from the debug build's objects
# with the Swift runtime inside (scripts/static-relink.sh: SwiftPM's own link commands, with
# -static-stdlib; 6 s, the build left as it was). Its version ends in +debug.
DEB_DEBUG_BIN := $(DEB_DEBUG_DIR)/bin

deb-debug: deps system-test-deps
	$(SWIFT) build
	./scripts/static-relink.sh .build/debug.yaml "$$($(SWIFT) build --show-bin-path)" $(DEB_DEBUG_BIN) $(BINARIES)
	$(call make_deb,$(DEB_DEBUG_BIN),$(DEB_DEBUG_DIR),+debug,DEB_COMPRESSION=zstd)

# make_deb BUILT OUTDIR VERSION_SUFFIX [ENV]: stages make install from BUILT and packs it
# (scripts/make-deb.sh, run with ENV).
make_deb = rm -rf "$(2)/stage" && \
	$(MAKE) --no-print-directory install BUILT="$(1)" DESTDIR="$(CURDIR)/$(2)/stage" PREFIX=/usr SYSCONFDIR=/etc \
	  UNITDIR=/usr/lib/systemd/system DOCDIR=/usr/share/doc/tributary && \
	$(4) ./scripts/make-deb.sh "$(2)/stage" "$(2)" "$(3)" && ls -l $(2)/tributary_*.deb

system-test-base: system-test-deps
	Integration/system-test/image.sh --base "$(SYSTEST_DIR)"

system-test-deps:
	@$(call install_missing,$(SYSTEST_DEB_PACKAGES),--no-install-recommends)

# The .deb in a Debian 12 virtual machine (docs/system-test.md): the image is cached under
# $(SYSTEST_DIR) by its package list and the .deb's checksum.
SYSTEST_DEB_TARGET := $(if $(filter release,$(SYSTEST_BUILD)),deb,deb-debug)
SYSTEST_DEB_FROM   := $(if $(filter release,$(SYSTEST_BUILD)),$(DEB_DIR),$(DEB_DEBUG_DIR))
# The image's base (mmdebstrap: downloads and dpkg, little CPU) is built while the .deb is linked.
system-test: deps system-test-deps
	$(MAKE) --no-print-directory -j2 $(SYSTEST_DEB_TARGET) system-test-base
	Integration/system-test/image.sh "$(SYSTEST_DIR)" "$$(ls $(SYSTEST_DEB_FROM)/tributary_*.deb)"
	Integration/system-test/run.sh "$(SYSTEST_DIR)" $(SYSTEST_CUTS)

format:
	$(SWIFT) format --in-place --recursive Sources Tests Integration Benchmarks Package.swift

clean:
	rm -rf .build $(RELEASE_DIR) $(BENCH_DIR) $(DEB_DIR) $(DEB_DEBUG_DIR) $(SYSTEST_DIR) .run
