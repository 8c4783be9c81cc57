package buildinfo

import (
	"maps"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
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

// TestCollector: carve_build_info is 1 with the build as its labels, the
// version as carve version prints it.
func TestCollector(t *testing.T) {
	info := Info{Version: "v0.4.0-3-gabcdef1", Commit: "abcdef1", GoVersion: "go1.26.0", BuildDate: "2026-11-29T05:29:52Z"}
	reg := prometheus.NewRegistry()
	reg.MustRegister(Collector(info))
	families, err := reg.Gather()
	if err != nil || len(families) != 1 || families[0].GetName() != "carve_build_info" || len(families[0].GetMetric()) != 1 {
		t.Fatalf("gathered %v, %v; want one carve_build_info", families, err)
	}
	m := families[0].GetMetric()[0]
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	want := map[string]string{"version": info.Version, "commit": info.Commit, "go_version": info.GoVersion, "build_date": info.BuildDate}
	if m.GetGauge().GetValue() != 1 || !maps.Equal(labels, want) {
		t.Errorf("carve_build_info %v = %v, want %v = 1", labels, m.GetGauge().GetValue(), want)
	}
}
