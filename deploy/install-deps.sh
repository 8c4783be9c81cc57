#!/usr/bin/env bash
# Installs what `make test`, `make demo` and `make bench` need on a fresh
# Debian machine, as root. Idempotent: does nothing when all is present.
set -euo pipefail

need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v gcc >/dev/null 2>&1 || need+=(gcc libc6-dev)   # cgo, for go test -race
command -v git >/dev/null 2>&1 || need+=(git)

if ((${#need[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "install-deps: missing Debian packages: ${need[*]} (run as root, or install them)" >&2
    exit 1
  fi
  echo "install-deps: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
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
