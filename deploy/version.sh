#!/bin/sh
# Prints the version make build stamps into carve (carve version,
# carve_build_info, what agents register with), from the git checkout in
# the current directory:
#
#   v0.4.0              the commit a release tag names
#   v0.4.0-3-gabcdef1   three commits after v0.4.0 (a development build,
#                       of release v0.4 as far as the version skew goes)
#   ...-dirty           built from a modified tree
#   dev-abcdef1         no release tag is reachable: a clone without tags
#                       (a shallow one, or git fetch --no-tags) or a
#                       history before the first release; never compared
#   dev                 no git checkout at all (a source archive)
#
# Release tags are annotated tags vMAJOR.MINOR.PATCH on main (CHANGELOG.md);
# other tags are ignored.
set -eu

if ! git rev-parse --verify -q HEAD >/dev/null 2>&1; then
	echo dev
	exit 0
fi
if v=$(git describe --tags --match 'v[0-9]*.[0-9]*.[0-9]*' --dirty 2>/dev/null); then
	echo "$v"
	exit 0
fi
v="dev-$(git rev-parse --short HEAD)"
if ! git diff-index --quiet HEAD -- 2>/dev/null; then
	v="$v-dirty"
fi
if [ "$(git rev-parse --is-shallow-repository 2>/dev/null)" = true ]; then
	echo "deploy/version.sh: a shallow clone without its release tag: building $v; for the release version: git fetch --unshallow --tags" >&2
else
	echo "deploy/version.sh: no release tag v*.*.* reachable from HEAD: building $v; git fetch --tags for the release version" >&2
fi
echo "$v"
