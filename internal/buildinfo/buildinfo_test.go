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
