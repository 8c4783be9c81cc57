#!/usr/bin/env bash
# Runs every fuzz target in the tree for $FUZZTIME each (make fuzz). The
# targets are found, not listed: each `func FuzzXxx(f *testing.F)` in a
# _test.go file, run from the module that holds it (the nearest go.mod), so a
# target added, renamed or moved is never missed.
# Usage: deploy/fuzz.sh          run them all
#        deploy/fuzz.sh -list    print "module-dir package-dir name" lines
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-20s}

# targets prints one "module-dir ./package-dir Name" line per fuzz target.
targets() {
  find . \( -name .git -o -name testdata -o -name bin \) -prune -o -name '*_test.go' -print |
    sort | while read -r file; do
      dir=$(dirname "$file")
      mod=$dir
      while [[ ! -e $mod/go.mod ]]; do mod=$(dirname "$mod"); done
      rel=${dir#"$mod"}
      sed -nE 's/^func (Fuzz([A-Z0-9_][A-Za-z0-9_]*)?)\([A-Za-z_][A-Za-z0-9_]* \*testing\.F\).*/\1/p' "$file" |
        while read -r name; do echo "$mod ./${rel#/} $name"; done
    done
}

if [[ ${1:-} == -list ]]; then
  targets
  exit 0
fi

list=$(targets)
if [[ -z $list ]]; then
  echo "fuzz: no fuzz targets found" >&2
  exit 1
fi
n=0
while read -r mod pkg name; do
  echo "fuzz: $name in $pkg ($FUZZTIME)"
  (cd "$mod" && "$GO" test -run '^$' -fuzz "^$name\$" -fuzztime "$FUZZTIME" "$pkg")
  n=$((n + 1))
done <<<"$list"
echo "fuzz: $n targets, $FUZZTIME each"
