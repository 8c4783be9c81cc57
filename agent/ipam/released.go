package ipam

import (
	"time"

	"github.com/carve-net/carve/agent/ipam/reclaimwatch"
)

// releaseMemory is how long a release keeps its attachment's cached CNI
// result from being reclaimed (reclaimwatch.ReleaseMemory).
const releaseMemory = reclaimwatch.ReleaseMemory

// recentReleases are the attachments this agent released lately
// (reclaimwatch.Releases), by allocKey; the caller holds s.mu.
type recentReleases reclaimwatch.Releases

func (r *recentReleases) mark(key string, now time.Time) { (*reclaimwatch.Releases)(r).Mark(key, now) }

func (r *recentReleases) prune(now time.Time) []string { return (*reclaimwatch.Releases)(r).Prune(now) }

func (r *recentReleases) forget(key string) bool { return (*reclaimwatch.Releases)(r).Forget(key) }

func (r *recentReleases) load(released map[string]time.Time) {
	(*reclaimwatch.Releases)(r).Load(released)
}

func (r *recentReleases) released(key string, now time.Time) bool {
	return (*reclaimwatch.Releases)(r).Released(key, now)
}
