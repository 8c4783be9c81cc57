package buildinfo

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestFrom(t *testing.T) {
	vcs := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.time", Value: "2026-11-27T10:00:00Z"}, {Key: "vcs.modified", Value: "true"},
	}}
	tests := []struct {
		name                  string
		version, commit, date string
		bi                    *debug.BuildInfo
		want                  Info
	}{
		{"ldflags win", "v0.3.0", "def456", "2026-11-27T12:00:00Z", vcs, Info{"v0.3.0", "def456", "go1.26.0", "2026-11-27T12:00:00Z"}},
		{"toolchain's vcs", "", "", "", vcs, Info{"dev", "abc123-dirty", "go1.26.0", "2026-11-27T10:00:00Z"}},
		{"module version", "", "", "", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v0.4.1"}}, Info{"v0.4.1", "", "go1.26.0", ""}},
		{"nothing", "", "", "", nil, Info{Version: "dev"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := from(tt.version, tt.commit, tt.date, tt.bi)
			if tt.bi == nil {
				got.GoVersion = "" // the running toolchain's
			}
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
	if s := (Info{"v0.3.0", "abc", "go1.26.0", "2026-11-27T12:00:00Z"}).String(); s != "carve v0.3.0 (commit abc, go1.26.0, built 2026-11-27T12:00:00Z)" {
		t.Errorf("String: %q", s)
	}
	if s := Get().String(); !strings.HasPrefix(s, "carve ") {
		t.Errorf("Get: %q", s)
	}
}

func TestSkewProblem(t *testing.T) {
	tests := []struct {
		a, b string
		want string // a part of the problem, "" for none
	}{
		{"v0.3.0", "v0.3.2", ""},
		{"v0.3.0", "v0.4.0", ""},
		{"v0.4.0-3-gabcdef", "v0.3.1", ""},
		{"v0.2.0", "v0.4.0", "more than 1 minor version apart"},
		{"v1.0.0", "v0.9.0", "different major versions"},
		{"dev", "v0.1.0", ""},
		{"v1.x", "v1.0.0", ""},
		{"v1", "v1.0.0", ""},
	}
	for _, tt := range tests {
		got := SkewProblem(tt.a, tt.b)
		if (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
			t.Errorf("SkewProblem(%q, %q) = %q, want %q", tt.a, tt.b, got, tt.want)
		}
	}
}
