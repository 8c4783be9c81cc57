package buildinfo

import (
	"strings"
	"testing"
)

func TestParseRelease(t *testing.T) {
	tests := []struct {
		version string
		want    Release
		ok      bool
	}{
		{"v0.4.0", Release{0, 4}, true},
		{"v0.4.2", Release{0, 4}, true},
		{"v1.12.3", Release{1, 12}, true},
		{"v0.4.0-3-gabcdef1", Release{0, 4}, true},                    // make build between releases
		{"v0.4.0-3-gabcdef1-dirty", Release{0, 4}, true},              // and from a modified tree
		{"v0.4.0-dirty", Release{0, 4}, true},                         // the tagged commit, modified
		{"v0.4.1-0.20261129052800-65163cfcc809", Release{0, 4}, true}, // go build after v0.4.0
		{"v0.4.1-0.20261129052800-65163cfcc809+dirty", Release{0, 4}, true},
		{"v0.5.0-rc.1", Release{0, 5}, true},
		{"v0.0.0-20261129052800-65163cfcc809", Release{}, false}, // go build, no release tag
		{"v0.0.0-20261129052800-65163cfcc809+dirty", Release{}, false},
		{"dev", Release{}, false},
		{"dev-65163cf", Release{}, false}, // deploy/version.sh without a tag
		{"dev-65163cf-dirty", Release{}, false},
		{"65163cf", Release{}, false}, // what make build stamped before releases
		{"(devel)", Release{}, false},
		{"unknown", Release{}, false},
		{"", Release{}, false},
		{"v1", Release{}, false},
		{"v1.x.0", Release{}, false},
		{"v01.2.3", Release{}, false},
		{"0.4.0", Release{}, false},
	}
	for _, tt := range tests {
		got, ok := ParseRelease(tt.version)
		if got != tt.want || ok != tt.ok {
			t.Errorf("ParseRelease(%q) = %v, %t; want %v, %t", tt.version, got, ok, tt.want, tt.ok)
		}
	}
}

// TestSkewProblems: the supported skew with the version strings real
// builds carry: masters on one release line (two adjacent ones during
// their rolling upgrade), agents at most one minor version behind the
// newest master and never ahead, one major version; development builds
// never judged, builds between releases judged as their release.
func TestSkewProblems(t *testing.T) {
	tests := []struct {
		name    string
		masters Running
		agents  Running
		want    []string // a part of each finding, in order
	}{
		{"one release", Running{"v0.4.0": {"master m1", "master m2", "master m3"}}, Running{"v0.4.0": {"40 agents"}}, nil},
		{"patch versions mixed", Running{"v0.4.0": {"master m1"}, "v0.4.2": {"master m2"}}, Running{"v0.4.1": {"3 agents"}}, nil},
		{"agents one minor behind", Running{"v0.4.0": {"master m1"}}, Running{"v0.3.0": {"5 agents"}, "v0.4.0": {"2 agents"}}, nil},
		{"a development build of the masters' release", Running{"v0.4.0": {"master m1"}, "v0.4.0-3-gabcdef1": {"master m2"}},
			Running{"v0.4.0-3-gabcdef1-dirty": {"1 agents"}, "v0.4.1-0.20261129052800-65163cfcc809": {"1 agents"}}, nil},
		{"development builds without a release", Running{"dev-65163cf": {"master m1"}, "v0.4.0": {"master m2"}},
			Running{"dev": {"1 agents"}, "65163cf": {"2 agents"}, "v0.0.0-20261129052800-65163cfcc809": {"1 agents"}, "unknown": {"3 agents"}}, nil},
		{"nothing of a release", Running{"dev": {"master m1"}}, Running{"dev-abcdef1": {"3 agents"}}, nil},
		{"masters mid-upgrade", Running{"v0.3.1": {"master m1"}, "v0.4.0": {"master m2", "master m3"}}, Running{"v0.3.1": {"9 agents"}},
			[]string{"the masters run two releases (v0.3.1 on master m1; v0.4.0 on master m2, master m3): a rolling upgrade"}},
		{"masters two minors apart", Running{"v0.2.0": {"master m1"}, "v0.4.0": {"master m2"}}, nil,
			[]string{"the masters run releases more than one minor version apart"}},
		{"agents two minors behind", Running{"v0.4.0": {"master m1"}}, Running{"v0.2.3": {"4 agents"}, "v0.3.0": {"1 agents"}},
			[]string{"agents run more than 1 minor version behind the masters (v0.2.3 on 4 agents; the masters: v0.4.0 on master m1): upgrade them to v0.4"}},
		{"agents ahead of the masters", Running{"v0.3.0": {"master m1"}}, Running{"v0.4.0-2-gabcdef1": {"1 agents"}},
			[]string{"agents run a newer release than every master (v0.4.0-2-gabcdef1 on 1 agents; the masters: v0.3.0 on master m1): upgrade the masters first"}},
		{"agents ahead of masters mid-upgrade", Running{"v0.3.0": {"master m1"}, "v0.4.0": {"master m2"}}, Running{"v0.5.0": {"1 agents"}, "v0.2.0": {"2 agents"}},
			[]string{"the masters run two releases", "agents run a newer release", "agents run more than 1 minor version behind"}},
		{"major versions", Running{"v1.0.0": {"master m1"}}, Running{"v0.9.0": {"2 agents"}},
			[]string{"builds of 2 major versions run side by side (v0.9.0 on 2 agents; v1.0.0 on master m1)"}},
		{"agents only", nil, Running{"v0.2.0": {"1 agents"}, "v0.4.0": {"1 agents"}}, []string{"agents run releases more than 1 minor version apart"}},
		{"agents only, adjacent", Running{"dev": {"master m1"}}, Running{"v0.3.0": {"1 agents"}, "v0.4.0": {"1 agents"}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := SkewProblems(tt.masters, tt.agents)
			if len(got) != len(tt.want) {
				t.Fatalf("findings %q, want %d naming %q", got, len(tt.want), tt.want)
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("finding %d %q lacks %q", i, got[i], w)
				}
			}
		})
	}
}
