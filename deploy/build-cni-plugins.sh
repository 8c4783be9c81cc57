#!/usr/bin/env bash
# Usage: deploy/build-cni-plugins.sh DIR
#
# Builds the reference CNI plugins carve's conflists chain with (bridge,
# loopback, portmap, and host-local for comparisons) into DIR, from the
# github.com/containernetworking/plugins version pinned in go.mod, so that
# tests, the demo and the benchmarks run exactly that version. Does nothing
# when DIR already holds them built from that version with this Go (a stamp
# file records both).
set -euo pipefail

if [[ $# -ne 1 || -z $1 ]]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
mkdir -p "$1"
dir=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."

GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
module=github.com/containernetworking/plugins
plugins=(bridge loopback portmap host-local)
pkgs=("$module/plugins/main/bridge" "$module/plugins/main/loopback"
      "$module/plugins/meta/portmap" "$module/plugins/ipam/host-local")

# The version as the build resolves it, replace directives included.
version=$("$GO" list -m -f '{{.Path}} {{.Version}}{{with .Replace}} => {{.Path}} {{.Version}}{{end}}' "$module")
want="$version / $("$GO" env GOVERSION)"
stamp="$dir/.carve-cni-plugins"

current=true
for p in "${plugins[@]}"; do
  [[ -x $dir/$p ]] || current=false
done
if $current && [[ -f $stamp && $(<"$stamp") == "$want" ]]; then
  exit 0
fi

echo "build-cni-plugins: building ${plugins[*]} ($version) into $dir"
rm -f "$stamp"
"$GO" build -trimpath -o "$dir/" "${pkgs[@]}"
printf '%s\n' "$want" >"$stamp.tmp"
mv "$stamp.tmp" "$stamp"
