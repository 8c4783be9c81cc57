#!/usr/bin/env bash
# Installs what `make test`, `make demo` and `make bench` need on a fresh
# Debian machine, as root. Idempotent: does nothing when all is present.
set -euo pipefail

need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v gcc >/dev/null 2>&1 || need+=(gcc libc6-dev)   # cgo, for go test -race
command -v git >/dev/null 2>&1 || need+=(git)
# The Docker plugin's test, the mixed-containers e2e test and the demo run a
# real engine inside a lab network namespace (internal/lab/dockerlab), with a
# tiny image made from a static busybox.
if ! command -v dockerd >/dev/null 2>&1 || ! command -v containerd-shim-runc-v2 >/dev/null 2>&1; then
  need+=(docker.io)
fi
# --- podman (internal/lab/podmanlab) ---
# The Podman lab runs Debian's rootful podman 4.3.1 with its CNI backend
# inside a lab network namespace, with Debian's CNI plugins (1.1.1, in
# /usr/lib/cni). podman pulls conmon, crun or runc and containers-common;
# the plugins are only suggested, so they are named here. Neither package
# ships a service that starts on install (the guard below covers it anyway).
command -v podman >/dev/null 2>&1 || need+=(podman)
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local ]] || need+=(containernetworking-plugins)
# --- end podman ---
# (output captured, not piped into grep -q: with pipefail, SIGPIPE would fail the check)
static=$(ldd /bin/busybox 2>&1 || true)
[[ $static == *"not a dynamic"* ]] || need+=(busybox-static)

if ((${#need[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "install-deps: missing Debian packages: ${need[*]} (run as root, or install them)" >&2
    exit 1
  fi
  echo "install-deps: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Never let a package start its service (a system dockerd would create a
  # bridge and firewall rules in the root namespace): a policy-rc.d guard
  # for the length of the install, removed again if we put it there.
  guard=""
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    guard=/usr/sbin/policy-rc.d
  fi
  trap '[[ -n "$guard" ]] && rm -f "$guard"' EXIT
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ! command -v go >/dev/null 2>&1; then
  if [[ -x /usr/local/go/bin/go ]]; then
    echo "install-deps: Go is at /usr/local/go/bin; add it to PATH" >&2
  else
    echo "install-deps: Go 1.26 is required (go.mod); Debian's golang package is older" >&2
  fi
  exit 1
fi
