#!/usr/bin/env bash
# Installs what `make test`, `make demo` and `make bench` need on a fresh
# Debian machine, as root. Idempotent: does nothing when all is present.
set -euo pipefail

need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v gcc >/dev/null 2>&1 || need+=(gcc libc6-dev)   # cgo, for go test -race
command -v git >/dev/null 2>&1 || need+=(git)
# deploy's tests verify the systemd units with systemd-analyze, which Debian
# ships in its systemd package. Installing it starts nothing: its postinst
# calls systemctl only when systemd is PID 1 (/run/systemd/system), and
# otherwise only enables units (symlinks), writes /etc/machine-id and adds
# system users; the policy-rc.d guard below covers any service start. It
# does not replace /sbin/init (that is systemd-sysv, not installed).
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
# The encryption e2e test captures the underlay with tcpdump (in the lab's
# underlay namespace only) to show that nothing but WireGuard crosses it.
command -v tcpdump >/dev/null 2>&1 || need+=(tcpdump)
# The container engines' labs run a real engine only inside a lab network
# namespace (the policy-rc.d guard below keeps any package's service from
# starting in the root namespace), on tiny images made from a static
# busybox (test/lab/enginelab):
# - dockerlab (the Docker plugin's test, the mixed-containers e2e test, the
#   demo): Debian's docker.io;
# - containerdlab: Debian's containerd (1.6, CRI plugin built in; ctr);
# - podmanlab: Debian's rootful podman (4.3, CNI backend), which pulls
#   conmon, crun or runc and containers-common.
# containerdlab and podmanlab put their pods and containers on networks of
# Debian's CNI plugins in /usr/lib/cni (containernetworking-plugins, which
# neither engine's package depends on).
if ! command -v dockerd >/dev/null 2>&1 || ! command -v containerd-shim-runc-v2 >/dev/null 2>&1; then
  need+=(docker.io)
fi
command -v containerd >/dev/null 2>&1 || need+=(containerd)
command -v podman >/dev/null 2>&1 || need+=(podman)
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local ]] || need+=(containernetworking-plugins)
# The agent keeps its FORWARD accept rules with iptables (package firewall);
# its tests and the e2e tests drive both backends, inside their namespaces
# only. Debian's iptables package has iptables-nft and iptables-legacy.
[[ -x /usr/sbin/iptables-nft-save && -x /usr/sbin/iptables-legacy-save ]] || need+=(iptables)
# deploy's tests check the alert rules of deploy/prometheus with promtool
# (check rules, test rules), which Debian ships in its prometheus package
# (its service is not started: the policy-rc.d guard below).
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
# test/bench/dataplane measures throughput with iperf3.
command -v iperf3 >/dev/null 2>&1 || need+=(iperf3)
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
