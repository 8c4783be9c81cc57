// Package denylist is the masters' deny list of certificates: the
// revocations the Raft log committed, by serial (api.CanonicalSerial),
// what readers see of it (the set every TLS handshake and request checks
// without a lock, the state's "revoked" field), the dropping of those
// whose certificate expired, and the signal that tells the list's owner
// to close the connections a revoked certificate still holds. It decides
// nothing about agents (master/state deletes a revoked agent's record)
// and imports nothing of ours but api.
//
// A List is guarded by its owner's lock (the lease table's), but for
// IsRevoked and Signals, which any goroutine may call at any time.
package denylist

import (
	"encoding/json"
	"maps"
	"slices"
	"sync/atomic"

	"github.com/carve-net/carve/api"
)

// List is the deny list. Make it with New.
type List struct {
	bySerial map[string]api.Revocation
	// set and field are what readers see of bySerial, renewed at every
	// change: the serials, and the state's `,"revoked":[...]` field (nil
	// while the list is empty).
	set   atomic.Pointer[map[string]struct{}]
	field []byte
	// kick is the owner's signal (Signals); it outlives Reset.
	kick chan struct{}
}

// New is an empty list.
func New() *List {
	l := &List{kick: make(chan struct{}, 1)}
	l.Reset()
	return l
}

// Reset empties the list (a table reset for a restore); the owner's
// signal channel stays.
func (l *List) Reset() {
	l.bySerial = map[string]api.Revocation{}
	l.changed()
}

// Add puts r on the list and signals the owner; a serial listed already
// changes nothing (false).
func (l *List) Add(r api.Revocation) bool {
	if _, ok := l.bySerial[r.Serial]; ok {
		return false
	}
	l.bySerial[r.Serial] = r
	l.changed()
	l.signal()
	return true
}

// Load puts the revocations of a snapshot on the list, which Reset
// emptied, and signals the owner when there are any.
func (l *List) Load(rs []api.Revocation) {
	for _, r := range rs {
		l.bySerial[r.Serial] = r
	}
	l.changed()
	if len(l.bySerial) > 0 {
		l.signal()
	}
}

// Keep puts back the revocations of rs whose serial is not listed (those
// a restore of an older snapshot would take back: it never does).
func (l *List) Keep(rs []api.Revocation) {
	for _, r := range rs {
		if _, ok := l.bySerial[r.Serial]; !ok {
			l.bySerial[r.Serial] = r
		}
	}
	l.changed()
}

// Prune drops the revocations of certificates expired by now (Unix
// seconds, the leader's clock in a compaction command), and tells whether
// it dropped any. An expired certificate fails verification anyway.
func (l *List) Prune(now int64) bool {
	pruned := false
	for serial, r := range l.bySerial {
		if r.NotAfter > 0 && r.NotAfter < now {
			delete(l.bySerial, serial)
			pruned = true
		}
	}
	if pruned {
		l.changed()
	}
	return pruned
}

// Sorted is the list sorted by serial (nil when empty).
func (l *List) Sorted() []api.Revocation {
	var out []api.Revocation
	for _, s := range slices.Sorted(maps.Keys(l.bySerial)) {
		out = append(out, l.bySerial[s])
	}
	return out
}

// Field is the state's `,"revoked":[...]` field, the list sorted by
// serial, or nil when the list is empty; not to be changed.
func (l *List) Field() []byte { return l.field }

// IsRevoked tells whether the certificate of serial (api.CanonicalSerial)
// is on the list. It takes no lock: every TLS handshake and request of the
// masters asks.
func (l *List) IsRevoked(serial string) bool {
	set := l.set.Load()
	if set == nil {
		return false
	}
	_, ok := (*set)[serial]
	return ok
}

// Signals receives a signal whenever a certificate is added, or a snapshot
// holding revocations is loaded. Signals coalesce (one waits at most), and
// the list starts no goroutine for them.
func (l *List) Signals() <-chan struct{} { return l.kick }

// signal signals Signals; it never blocks (the apply does not wait for the
// reader).
func (l *List) signal() {
	select {
	case l.kick <- struct{}{}:
	default: // one is waiting already: the reader sees every revocation then
	}
}

// changed renews what readers see of the list.
func (l *List) changed() {
	set := make(map[string]struct{}, len(l.bySerial))
	for s := range l.bySerial {
		set[s] = struct{}{}
	}
	l.set.Store(&set)
	l.field = nil
	if list := l.Sorted(); len(list) > 0 {
		data, _ := json.Marshal(list) // plain strings and numbers
		l.field = append([]byte(`,"revoked":`), data...)
	}
}
