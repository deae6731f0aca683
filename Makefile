# Tributary — `make run` runs the demo pipeline, `make test` runs every test.
# Both install what a fresh Debian machine lacks first (`make deps`).

SWIFT        ?= swift
PREFIX       ?= /usr/local
DESTDIR      ?=
RELEASE_DIR  := .build-release
# Debian packages the build and tests need (C libraries wrapped as .systemLibrary targets).
DEB_PACKAGES := liblmdb-dev zlib1g-dev libsqlite3-dev libsystemd-dev pkg-config

.PHONY: all deps build test run bench clean format help

all: build

help:
	@echo "make deps   install missing system packages ($(DEB_PACKAGES))"
	@echo "make build  debug build of every target"
	@echo "make test   build and run every test (unit and multi-process)"
	@echo "make run    demo: producers write into a fresh group directory, then show the store"
	@echo "make bench  release build, then benchmarks next to their C baselines"

# Idempotent: a quick no-op when every package is installed.
deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=""; [ "$$(id -u)" -eq 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

build: deps
	$(SWIFT) build

test: deps
	$(SWIFT) test

run: build
	./scripts/run-demo.sh

bench: deps
	$(SWIFT) build -c release --scratch-path $(RELEASE_DIR) --product tributary-bench
	$(SWIFT) build -c release --scratch-path $(RELEASE_DIR) --product lmdb-baseline
	$(RELEASE_DIR)/release/tributary-bench --bin $(RELEASE_DIR)/release

format:
	$(SWIFT) format --in-place --recursive Sources Tests Integration Benchmarks Package.swift

clean:
	rm -rf .build $(RELEASE_DIR) .run
