// Package reclaimwatch is what the IPAM remembers to judge the addresses
// the host's runtimes left behind, by attachment key: the releases of the
// last ReleaseMemory (Releases), whose cached CNI results must not be
// taken back, and the network namespaces seen missing, since when
// (Missing), whose allocations are released once they stayed missing long
// enough. It decides nothing of its own: its owner (the IPAM) scans the
// host, asks, and releases. It has no lock: its owner serializes the calls.
//
// Its exported surface is this file.
package reclaimwatch

import (
	"maps"
	"slices"
	"time"
)

// ReleaseMemory is how long an attachment's release keeps its cached CNI
// result from being reclaimed: longer than carve-ipam waits for any answer
// (cni.DefaultTimeout, 30s), after which libcni has either deleted the
// entry (the DEL succeeded) or will send the DEL again (it failed).
const ReleaseMemory = time.Minute

// Releases are the attachments this agent released, or was asked to DEL,
// lately. libcni deletes its cached ADD result only after every plugin
// answered the DEL, so the IPAM's reclaim from the CNI cache, run when an
// overlay is created (a restart's first sync) or adopts a block, can find
// the entry of a DEL this agent has decided, committed or even answered.
// Taking that address back would leak it for good: the runtime never DELs
// it again. So the reclaim skips the attachments released here within
// ReleaseMemory. A release is kept on disk too (in the transaction that
// deletes the allocation), since the DEL may be the previous process's:
// one answered just before a crash whose cache entry libcni removes only
// after the restarted agent's first sync. The zero value remembers none.
type Releases struct {
	when  map[string]time.Time // key -> last release
	order []releaseMark        // oldest first, to forget them
}

type releaseMark struct {
	key  string
	when time.Time
}

// Mark remembers a release of key at now.
func (r *Releases) Mark(key string, now time.Time) {
	if r.when == nil {
		r.when = map[string]time.Time{}
	}
	r.when[key] = now
	r.order = append(r.order, releaseMark{key, now})
}

// Prune forgets the releases older than ReleaseMemory at now and returns
// their keys, to delete from disk.
func (r *Releases) Prune(now time.Time) (forgotten []string) {
	for len(r.order) > 0 && now.Sub(r.order[0].when) > ReleaseMemory {
		m := r.order[0]
		r.order = r.order[1:]
		if t, ok := r.when[m.key]; ok && t.Equal(m.when) {
			delete(r.when, m.key)
			forgotten = append(forgotten, m.key)
		}
	}
	return forgotten
}

// Forget drops key's release, reporting whether there was one: the
// attachment was allocated again.
func (r *Releases) Forget(key string) bool {
	_, ok := r.when[key]
	delete(r.when, key)
	return ok
}

// Load remembers the releases a previous process kept on disk.
func (r *Releases) Load(released map[string]time.Time) {
	keys := slices.SortedFunc(maps.Keys(released), func(a, b string) int { return released[a].Compare(released[b]) })
	for _, k := range keys {
		r.Mark(k, released[k])
	}
}

// Released says whether key was released within ReleaseMemory of now.
func (r *Releases) Released(key string, now time.Time) bool {
	t, ok := r.when[key]
	return ok && now.Sub(t) <= ReleaseMemory
}

// Missing remembers, between the scans of the network namespaces of the
// allocations, which were seen missing and since when.
type Missing struct {
	after time.Duration
	// since: when the namespace of an allocation (key) was first seen
	// missing, with the path seen.
	since map[string]missing
	// reported: dry-run findings already logged (once each).
	reported map[string]bool
	// seen: the keys of the scan in progress.
	seen map[string]bool
	// scans counts the scans made.
	scans uint64
}

type missing struct {
	netns string
	since time.Time
}

// NewMissing returns the memory of missing namespaces whose allocations
// are due after after (0: never).
func NewMissing(after time.Duration) *Missing {
	return &Missing{after: after, since: map[string]missing{}, reported: map[string]bool{}}
}

// Every is the period of the namespace scan: a quarter of the grace,
// between 10ms and 30s.
func (m *Missing) Every() time.Duration {
	return min(max(m.after/4, 10*time.Millisecond), 30*time.Second)
}

// Scans is how many scans began.
func (m *Missing) Scans() uint64 { return m.scans }

// Begin starts a scan.
func (m *Missing) Begin() {
	m.scans++
	m.seen = map[string]bool{}
}

// Due notes what the scan saw of an allocation's namespace (netns, gone
// or not at now), and tells whether it has been missing, at the same
// path, for the grace: due, with since when. A namespace seen again, or
// missing at another path, starts over.
func (m *Missing) Due(key, netns string, gone bool, now time.Time) (since time.Time, due bool) {
	m.seen[key] = true
	was, ok := m.since[key]
	if !gone || (ok && was.netns != netns) {
		delete(m.since, key)
		delete(m.reported, key)
		if !gone {
			return time.Time{}, false
		}
		ok = false
	}
	if !ok {
		m.since[key] = missing{netns: netns, since: now}
		return time.Time{}, false
	}
	if now.Sub(was.since) < m.after {
		return time.Time{}, false
	}
	return was.since, true
}

// FirstReport tells whether a dry run's finding of key is new (to log),
// and remembers it.
func (m *Missing) FirstReport(key string) bool {
	if m.reported[key] {
		return false
	}
	m.reported[key] = true
	return true
}

// Released forgets key, whose allocation was released.
func (m *Missing) Released(key string) { delete(m.since, key) }

// End ends a scan: what it did not see is forgotten.
func (m *Missing) End() {
	for key := range m.since {
		if !m.seen[key] {
			delete(m.since, key)
			delete(m.reported, key)
		}
	}
	m.seen = nil
}
