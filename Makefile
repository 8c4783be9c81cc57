# carve: see README.md. Every target installs or builds what it needs.
SHELL := /bin/bash
GO    ?= $(shell command -v go || echo /usr/local/go/bin/go)
export PATH := $(dir $(GO)):$(PATH)
# -trimpath everywhere: binaries name their sources by import path, not by
# where the checkout lies (reproducible builds), and the build cache is then
# shared by every checkout of the tree. Without it Go keys each compiled
# package by its directory, so a fresh clone (CI, a worktree) compiled every
# package of the module again, three ways (race, plain, vet): most of the
# 300 of 734 CPU-seconds that such a `make test` spent outside its tests.
override GOFLAGS := -trimpath $(GOFLAGS)
export GOFLAGS

.PHONY: all build deps cni-plugins lint test test-lint test-race test-e2e test-norace fuzz demo bench clean

all: build

deps:
	@deploy/install-deps.sh

# What carve version prints and carve_build_info shows: the release tag
# (v0.4.0, or v0.4.0-3-gabcdef1 after it; dev-abcdef1 where no tag is
# reachable, as in a shallow clone: deploy/version.sh), the commit and its
# time (a build of a commit is reproducible). Expanded only by the targets
# that build carve.
VERSION    ?= $(shell deploy/version.sh)
COMMIT     ?= $(shell git rev-parse HEAD 2>/dev/null)
BUILD_DATE ?= $(shell git log -1 --format=%cI 2>/dev/null)
BUILDINFO  := github.com/carve-net/carve/internal/buildinfo
LDFLAGS     = -s -w -X $(BUILDINFO).version=$(VERSION) -X $(BUILDINFO).commit=$(COMMIT) -X $(BUILDINFO).date=$(BUILD_DATE)

# bin/carve is the production binary; bin/carve-lab is the demo (`carve demo`
# execs it), kept apart so that carve links no lab or test harness.
build: deps
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/carve ./cmd/carve
	@# carve-ipam is exec'd twice per container (ADD, DEL): static (no cgo,
	@# no dynamic loader) it starts in less time than host-local does.
	CGO_ENABLED=0 $(GO) build -ldflags "-s -w" -o bin/carve-ipam ./cmd/carve-ipam
	$(GO) build -ldflags "-s -w" -o bin/carve-lab ./test/cmd/carve-lab

# The CNI reference plugins (bridge, loopback, portmap, host-local), built
# from the github.com/containernetworking/plugins version pinned in go.mod.
cni-plugins: deps
	GO=$(GO) deploy/build-cni-plugins.sh bin/cni

# staticcheck, pinned, installed from the Go module proxy into bin/tools
# only when that version is absent (make clean removes it with bin/).
STATICCHECK_VERSION := v0.8.2
STATICCHECK := $(CURDIR)/bin/tools/staticcheck-$(STATICCHECK_VERSION)
$(STATICCHECK):
	@mkdir -p $(dir $@)
	GOBIN=$(CURDIR)/bin/tools $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(CURDIR)/bin/tools/staticcheck $@

# vet and staticcheck over carve's module.
lint: $(STATICCHECK)
	$(GO) vet ./...
	$(STATICCHECK) ./...

# The whole suite: vet, staticcheck, every package under the race detector,
# then the tests that run real weaveworks/mesh routers over TCP, which mesh's
# known data races keep out of -race (they carry a !race build tag), and the
# vet and tests of carve's fork of mesh (third_party/mesh, its own module).
# The four parts are independent and run at once (test-lint, test-race,
# test-e2e, test-norace; each one's output is printed whole when it ends): the race
# run spends much of its time waiting on lab clusters, which the others fill.
# The lab tests take the binaries and plugins built here (CARVE_BINARY,
# CARVE_LAB_BINARY, CARVE_CNI_PATH) instead of building their own.
TEST_ENV := CARVE_BINARY=$(CURDIR)/bin/carve CARVE_LAB_BINARY=$(CURDIR)/bin/carve-lab CARVE_CNI_PATH=$(CURDIR)/bin/cni:$(CURDIR)/bin
test: build cni-plugins $(STATICCHECK)
	@# /run/netns a shared mount point before any test makes a namespace (see
	@# netnslab.EnsureNetNSDir): `ip netns add` in one package would otherwise
	@# bind it onto itself over another package's namespaces.
	@mkdir -p /run/netns && (mountpoint -q /run/netns || mount --bind /run/netns /run/netns) && mount --make-shared /run/netns
	@$(MAKE) --no-print-directory -j4 --output-sync=target test-lint test-race test-e2e test-norace

# The parts of `make test`, which builds what they need first.
test-lint: $(STATICCHECK)
	$(GO) vet ./...
	$(STATICCHECK) ./...

test-race:
	$(TEST_ENV) $(GO) test -race -count=1 -p 3 -timeout 15m $$($(GO) list ./... | grep -v '/test/e2e$$')

# The end-to-end tests on their own, started at once: the longest package,
# whose tests spend their time waiting on their own lab clusters, four at
# a time (-parallel; the engine tests stay serial).
test-e2e:
	$(TEST_ENV) $(GO) test -race -count=1 -parallel 4 -timeout 15m ./test/e2e/

test-norace:
	$(GO) test -count=1 -timeout 5m ./gossip/...
	$(GO) test -count=1 -timeout 5m -run '^TestMeshBoundedConnections' ./agent/
	$(GO) test -count=1 -timeout 5m -run '^TestMeshRing' ./agent/ipam/
	cd third_party/mesh && $(GO) vet ./... && $(GO) test -count=1 -timeout 5m .

# A short coverage-guided pass over every fuzz target (the seeds also run in
# `make test`): deploy/fuzz.sh finds each FuzzXxx in the tree, so none is missed.
FUZZTIME ?= 20s
fuzz:
	GO=$(GO) FUZZTIME=$(FUZZTIME) deploy/fuzz.sh

demo: build cni-plugins
	./bin/carve demo $(DEMO_FLAGS)

# Each row stands beside a baseline measured in the same run: read the ratios.
bench: build
	$(GO) run ./test/bench/master
	$(GO) run ./test/bench/ring
	$(GO) run ./test/bench/vxlan
	$(GO) run ./test/bench/agent
	$(GO) run ./test/bench/cni
	$(GO) run ./test/bench/growth
	$(GO) run ./test/bench/scale
	$(GO) run ./test/bench/dataplane

clean:
	rm -rf bin
