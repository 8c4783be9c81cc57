// Package buildinfo says which build of carve is running: its version,
// commit, Go version and build date, from the -ldflags -X values make build
// sets, else from what the Go toolchain recorded in the binary
// (debug.ReadBuildInfo), and exports them as the carve_build_info metric;
// and judges the versions masters and agents run side by side against the
// supported skew (skew.go).
package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Set by the linker (make build):
//
//	-X github.com/carve-net/carve/internal/buildinfo.version=v0.4.0
//	-X github.com/carve-net/carve/internal/buildinfo.commit=<sha>
//	-X github.com/carve-net/carve/internal/buildinfo.date=<RFC 3339>
//
// They are written only by the linker, never at run time.
var version, commit, date string

// Info is one build of carve.
type Info struct {
	// Version is the release ("v0.4.0", or git describe's
	// "v0.4.0-3-gabcdef1" after it); "dev-abcdef1" where the build found
	// no release tag (deploy/version.sh), "dev" when unknown. A go build
	// without make has Go's pseudo-version of the commit.
	Version string `json:"version"`
	// Commit is the VCS revision ("" when unknown), with "-dirty" when
	// built from a modified tree.
	Commit    string `json:"commit,omitempty"`
	GoVersion string `json:"go_version"`
	// BuildDate is when it was built (or its commit's time), RFC 3339.
	BuildDate string `json:"build_date,omitempty"`
}

// Get returns the running build's Info.
func Get() Info {
	return from(version, commit, date, readBuildInfo())
}

// readBuildInfo is debug.ReadBuildInfo, nil when the binary has none.
func readBuildInfo() *debug.BuildInfo {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return nil
	}
	return bi
}

// from fills an Info from the linker's values, then the toolchain's.
func from(version, commit, date string, bi *debug.BuildInfo) Info {
	info := Info{Version: version, Commit: commit, GoVersion: runtime.Version(), BuildDate: date}
	if bi == nil {
		if info.Version == "" {
			info.Version = "dev"
		}
		return info
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		info.Version = bi.Main.Version
	}
	if info.Version == "" {
		info.Version = "dev"
	}
	if info.Commit == "" {
		info.Commit = settings["vcs.revision"]
		if info.Commit != "" && settings["vcs.modified"] == "true" {
			info.Commit += "-dirty"
		}
	}
	if info.BuildDate == "" {
		info.BuildDate = settings["vcs.time"]
	}
	if bi.GoVersion != "" {
		info.GoVersion = bi.GoVersion
	}
	return info
}

// String is the one line carve version prints.
func (i Info) String() string {
	s := "carve " + i.Version
	var parts []string
	if i.Commit != "" {
		parts = append(parts, "commit "+i.Commit)
	}
	parts = append(parts, i.GoVersion)
	if i.BuildDate != "" {
		parts = append(parts, "built "+i.BuildDate)
	}
	return s + " (" + strings.Join(parts, ", ") + ")"
}

// Collector is the carve_build_info gauge: always 1, its labels the build.
func Collector(i Info) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "carve_build_info",
		Help: "The running build of carve: version, commit, Go version and build date as labels; always 1.",
		ConstLabels: prometheus.Labels{
			"version": i.Version, "commit": i.Commit, "go_version": i.GoVersion, "build_date": i.BuildDate,
		},
	})
	g.Set(1)
	return g
}
