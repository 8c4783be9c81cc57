package ipam

import (
	"maps"
	"slices"
	"time"
)

// releaseMemory is how long an attachment's release keeps its cached CNI
// result from being reclaimed: longer than carve-ipam waits for any answer
// (cni.DefaultTimeout, 30s), after which libcni has either deleted the
// entry (the DEL succeeded) or will send the DEL again (it failed).
const releaseMemory = time.Minute

// recentReleases are the attachments this agent released, or was asked to
// DEL, lately. libcni deletes its cached ADD result only after every plugin
// answered the DEL, so reclaimFromCNICache, run when an overlay is created
// (a restart's first sync) or adopts a block, can find the entry of a DEL
// this agent has decided, committed or even answered. Taking that address
// back would leak it for good: the runtime never DELs it again. So the
// reclaim skips the attachments released here within releaseMemory. A
// release is kept on disk too (releasedBucket, in the transaction that
// deletes the allocation), since the DEL may be the previous process's: one
// answered just before a crash whose cache entry libcni removes only after
// the restarted agent's first sync. The caller holds s.mu.
type recentReleases struct {
	when  map[string]time.Time // allocKey -> last release
	order []releaseMark        // oldest first, to forget them
}

type releaseMark struct {
	key  string
	when time.Time
}

// mark remembers a release of key at now.
func (r *recentReleases) mark(key string, now time.Time) {
	if r.when == nil {
		r.when = map[string]time.Time{}
	}
	r.when[key] = now
	r.order = append(r.order, releaseMark{key, now})
}

// prune forgets the releases older than releaseMemory at now and returns
// their keys, to delete from disk.
func (r *recentReleases) prune(now time.Time) (forgotten []string) {
	for len(r.order) > 0 && now.Sub(r.order[0].when) > releaseMemory {
		m := r.order[0]
		r.order = r.order[1:]
		if t, ok := r.when[m.key]; ok && t.Equal(m.when) {
			delete(r.when, m.key)
			forgotten = append(forgotten, m.key)
		}
	}
	return forgotten
}

// forget drops key's release, reporting whether there was one: the
// attachment was allocated again.
func (r *recentReleases) forget(key string) bool {
	_, ok := r.when[key]
	delete(r.when, key)
	return ok
}

// load remembers the releases a previous process kept on disk.
func (r *recentReleases) load(released map[string]time.Time) {
	keys := slices.SortedFunc(maps.Keys(released), func(a, b string) int { return released[a].Compare(released[b]) })
	for _, k := range keys {
		r.mark(k, released[k])
	}
}

// released says whether key was released within releaseMemory of now.
func (r *recentReleases) released(key string, now time.Time) bool {
	t, ok := r.when[key]
	return ok && now.Sub(t) <= releaseMemory
}
