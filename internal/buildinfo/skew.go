package buildinfo

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Release is the release line (major and minor version) of a build: what
// the version skew compares. A build between releases belongs to the line
// of the release it was built after (v0.4.0-3-gabcdef1 is of v0.4); the
// patch version never matters.
type Release struct {
	Major, Minor int
}

// String is "v0.4".
func (r Release) String() string {
	return fmt.Sprintf("v%d.%d", r.Major, r.Minor)
}

// releaseVersion is a version of a release line: vMAJOR.MINOR.PATCH, then
// what git describe (-3-gabcdef1, -dirty) or Go's pseudo-versions
// (-0.20261129052800-abcdef123456, +dirty) append.
var releaseVersion = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)([-+].*)?$`)

// ParseRelease is the release line of a version; false for a development
// build that has none: "dev", "dev-abcdef1" (no release tag reachable), a
// bare commit (what make build stamped before deploy/version.sh), "(devel)",
// and Go's v0.0.0-TIMESTAMP-COMMIT pseudo-version of a go build in a
// history without release tags (v0.0.0 was never released).
func ParseRelease(v string) (Release, bool) {
	m := releaseVersion.FindStringSubmatch(v)
	if m == nil {
		return Release{}, false
	}
	major, err1 := strconv.Atoi(m[1])
	minor, err2 := strconv.Atoi(m[2])
	if err1 != nil || err2 != nil || major == 0 && minor == 0 && m[3] == "0" {
		return Release{}, false
	}
	return Release{major, minor}, true
}

// SupportedSkew is how many minor versions the agents may run behind the
// masters (docs/operations.md, "Upgrades and restarts"): a rolling upgrade
// goes one minor version at a time, masters first, then agents.
const SupportedSkew = 1

// Running is who runs one version: the master ids or agent counts that
// SkewProblems names in its findings ("master m1", "4 agents").
type Running map[string][]string

// SkewProblems judges the versions that masters and agents run against
// the supported skew, one finding per rule broken, "" never:
//
//   - every build is of one major version;
//   - the masters run one release line; two adjacent ones only while a
//     rolling upgrade of the masters is under way (finish it before
//     upgrading agents), never two further apart;
//   - no agent runs a newer line than the newest master's (masters first);
//   - no agent runs more than SupportedSkew minor versions behind it.
//
// Development builds (ParseRelease false) are not judged. A build between
// two releases counts as the one it was built after, so a development
// build is never skew against its own release.
func SkewProblems(masters, agents Running) []string {
	ms, as := lines(masters), lines(agents)
	var out []string
	all := mergeLines(ms, as)
	if majors := distinct(all, func(r Release) int { return r.Major }); len(majors) > 1 {
		return []string{fmt.Sprintf("builds of %d major versions run side by side (%s): a major version is never mixed; upgrade to one",
			len(majors), describe(all))}
	}
	if len(ms) > 0 {
		oldest, newest := ms[0].release, ms[len(ms)-1].release
		switch {
		case newest.Minor-oldest.Minor > 1:
			out = append(out, fmt.Sprintf("the masters run releases more than one minor version apart (%s): upgrade every master to %s, one minor version at a time",
				describe(ms), newest))
		case newest != oldest:
			out = append(out, fmt.Sprintf("the masters run two releases (%s): a rolling upgrade of the masters is under way; finish it (every master on %s) before upgrading agents",
				describe(ms), newest))
		}
		var ahead, behind []releaseLine
		for _, a := range as {
			switch {
			case a.release.Minor > newest.Minor:
				ahead = append(ahead, a)
			case newest.Minor-a.release.Minor > SupportedSkew:
				behind = append(behind, a)
			}
		}
		if len(ahead) > 0 {
			out = append(out, fmt.Sprintf("agents run a newer release than every master (%s; the masters: %s): upgrade the masters first",
				describe(ahead), describe(ms)))
		}
		if len(behind) > 0 {
			out = append(out, fmt.Sprintf("agents run more than %d minor version behind the masters (%s; the masters: %s): upgrade them to %s",
				SupportedSkew, describe(behind), describe(ms), newest))
		}
		return out
	}
	// No master of a release known: the agents among themselves.
	if len(as) > 1 && as[len(as)-1].release.Minor-as[0].release.Minor > SupportedSkew {
		out = append(out, fmt.Sprintf("agents run releases more than %d minor version apart (%s)", SupportedSkew, describe(as)))
	}
	return out
}

// releaseLine is who runs one release line, by version.
type releaseLine struct {
	release Release
	// who runs each version of the line, "v0.4.0 on master m1".
	versions []string
}

// lines groups r's release versions by release line, oldest first;
// development builds are left out.
func lines(r Running) []releaseLine {
	by := map[Release][]string{}
	for _, v := range slices.Sorted(maps.Keys(r)) {
		rel, ok := ParseRelease(v)
		if !ok || len(r[v]) == 0 {
			continue
		}
		by[rel] = append(by[rel], v+" on "+strings.Join(r[v], ", "))
	}
	out := make([]releaseLine, 0, len(by))
	for rel, versions := range by {
		out = append(out, releaseLine{rel, versions})
	}
	slices.SortFunc(out, func(a, b releaseLine) int {
		if a.release.Major != b.release.Major {
			return a.release.Major - b.release.Major
		}
		return a.release.Minor - b.release.Minor
	})
	return out
}

// mergeLines is a and b in one slice, oldest first (a line may repeat).
func mergeLines(a, b []releaseLine) []releaseLine {
	out := slices.Concat(a, b)
	slices.SortStableFunc(out, func(x, y releaseLine) int {
		if x.release.Major != y.release.Major {
			return x.release.Major - y.release.Major
		}
		return x.release.Minor - y.release.Minor
	})
	return out
}

func distinct(ls []releaseLine, key func(Release) int) map[int]bool {
	out := map[int]bool{}
	for _, l := range ls {
		out[key(l.release)] = true
	}
	return out
}

// describe renders lines as "v0.3.1 on 4 agents; v0.4.0 on master m1".
func describe(ls []releaseLine) string {
	var parts []string
	for _, l := range ls {
		parts = append(parts, l.versions...)
	}
	return strings.Join(parts, "; ")
}
