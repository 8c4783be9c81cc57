package master

import (
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/buildinfo"
)

// buildInfo is this master's build, as /cluster/status shows it.
func buildInfo() *api.BuildInfo {
	b := buildinfo.Get()
	return &api.BuildInfo{Version: b.Version, Commit: b.Commit, GoVersion: b.GoVersion, BuildDate: b.BuildDate}
}
