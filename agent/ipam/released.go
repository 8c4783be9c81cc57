package ipam

import "time"

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
// reclaim skips the attachments released here within releaseMemory. The
// caller holds s.mu.
type recentReleases struct {
	when  map[string]time.Time // allocKey -> last release
	order []releaseMark        // oldest first, to forget them
}

type releaseMark struct {
	key  string
	when time.Time
}

// mark remembers a release of key at now, and forgets the ones older than
// releaseMemory.
func (r *recentReleases) mark(key string, now time.Time) {
	for len(r.order) > 0 && now.Sub(r.order[0].when) > releaseMemory {
		m := r.order[0]
		r.order = r.order[1:]
		if r.when[m.key].Equal(m.when) {
			delete(r.when, m.key)
		}
	}
	if r.when == nil {
		r.when = map[string]time.Time{}
	}
	r.when[key] = now
	r.order = append(r.order, releaseMark{key, now})
}

// forget drops key's release: the attachment was allocated again.
func (r *recentReleases) forget(key string) { delete(r.when, key) }

// released says whether key was released within releaseMemory of now.
func (r *recentReleases) released(key string, now time.Time) bool {
	t, ok := r.when[key]
	return ok && now.Sub(t) <= releaseMemory
}
