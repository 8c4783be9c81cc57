package ring

// Joins: seeding the masters' leases and merging another peer's ring.

import (
	"fmt"
	"slices"
	"sort"
)

// Seed joins leases (and the tombstones of deleted agents) into the ring,
// adding to what each agent leases. Every peer that seeds the same table
// derives the same ring, and a newer table dominates an older one. changed
// reports whether the ring moved.
func (r *Ring) Seed(leases []Lease, tombstones []Tombstone) (changed bool, err error) {
	next, changed, err := r.trySeed(leases, nil, tombstones)
	if err != nil || !changed {
		return false, err
	}
	r.commit(next)
	return true, nil
}

// SeedSets joins complete lease sets (each agent's blocks at its record's
// version) and tombstones into the ring: a set replaces its agent's leases
// of a lower version, an older set than the one held changes nothing.
func (r *Ring) SeedSets(sets []LeaseSet, tombstones []Tombstone) (changed bool, err error) {
	leases, floors := flattenSets(r.newerSets(sets))
	next, changed, err := r.trySeed(leases, floors, tombstones)
	if err != nil || !changed {
		return false, err
	}
	r.commit(next)
	return true, nil
}

// newerSets drops the sets the ring holds at the same or a higher version:
// a set's version is the Raft index of its record, so an equal version is
// the same set and seeding it changes nothing. Seeding a whole view at
// every change of one record then costs a lookup per agent, not a sort.
func (r *Ring) newerSets(sets []LeaseSet) []LeaseSet {
	out := sets[:0:0]
	for _, s := range sets {
		if s.Version > tombIndex(r.st.sets, s.Owner) {
			out = append(out, s)
		}
	}
	return out
}

func flattenSets(sets []LeaseSet) ([]Lease, []Tombstone) {
	var leases []Lease
	floors := make([]Tombstone, 0, len(sets))
	for _, s := range sets {
		floors = append(floors, Tombstone{Owner: s.Owner, Version: s.Version})
		for _, p := range s.Prefixes {
			leases = append(leases, Lease{Owner: s.Owner, Prefix: p, Version: s.Version})
		}
	}
	return leases, floors
}

func (r *Ring) trySeed(leases []Lease, sets, tombstones []Tombstone) (state, bool, error) {
	ls := make([]leaseEntry, 0, len(leases))
	for _, l := range leases {
		if l.Owner == "" {
			return state{}, false, fmt.Errorf("%w: lease of %v without owner", ErrInvalid, l.Prefix)
		}
		if l.Version == 0 || l.Version > maxRaftIndex {
			return state{}, false, fmt.Errorf("%w: lease of %v has version %d outside [1, 2^32)", ErrInvalid, l.Prefix, l.Version)
		}
		start, end, err := r.u.prefixSpan(l.Prefix)
		if err != nil {
			return state{}, false, fmt.Errorf("lease of %s: %w", l.Owner, err)
		}
		ls = append(ls, leaseEntry{start: start, end: end, bits: l.Prefix.Bits(), owner: l.Owner, index: l.Version})
	}
	sort.Slice(ls, func(i, j int) bool { return ls[i].keyLess(ls[j]) })
	ls = dedupLeases(ls)
	ts := make([]Tombstone, 0, len(tombstones))
	for _, t := range tombstones {
		if t.Owner == "" || t.Version == 0 || t.Version > maxRaftIndex {
			return state{}, false, fmt.Errorf("%w: tombstone %q at %d", ErrInvalid, t.Owner, t.Version)
		}
		if t.Version > tombIndex(r.st.tombs, t.Owner) {
			ts = append(ts, t) // one held at the same or a higher index changes nothing
		}
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].Owner < ts[j].Owner })
	ts = dedupTombs(ts)
	leasesOut, err := joinLeases(r.st.leases, ls)
	if err != nil {
		return state{}, false, err
	}
	tombsOut := joinTombs(r.st.tombs, ts)
	fs := make([]Tombstone, 0, len(sets))
	for _, t := range sets {
		if t.Owner == "" || t.Version == 0 || t.Version > maxRaftIndex {
			return state{}, false, fmt.Errorf("%w: lease set of %q at %d", ErrInvalid, t.Owner, t.Version)
		}
		fs = append(fs, t)
	}
	sort.Slice(fs, func(i, j int) bool { return fs[i].Owner < fs[j].Owner })
	setsOut := joinTombs(r.st.sets, dedupTombs(fs))
	leasesOut = normalize(leasesOut, setsOut)
	if slices.Equal(leasesOut, r.st.leases) && slices.Equal(setsOut, r.st.sets) && slices.Equal(tombsOut, r.st.tombs) {
		return state{}, false, nil
	}
	return r.derive(r.st.raw, leasesOut, setsOut, tombsOut), true, nil
}

func dedupLeases(ls []leaseEntry) []leaseEntry {
	out := ls[:0]
	for _, l := range ls {
		if n := len(out); n > 0 && out[n-1].sameKey(l) {
			if l.beats(out[n-1]) {
				out[n-1] = l
			}
			continue
		}
		out = append(out, l)
	}
	return out
}

func dedupTombs(ts []Tombstone) []Tombstone {
	out := ts[:0]
	for _, t := range ts {
		if n := len(out); n > 0 && out[n-1].Owner == t.Owner {
			out[n-1].Version = max(out[n-1].Version, t.Version)
			continue
		}
		out = append(out, t)
	}
	return out
}

// joinLeases joins two sorted lease lists, by (prefix, owner). Overlapping
// leases are kept (the view resolves them); the error is kept for callers.
func joinLeases(a, b []leaseEntry) ([]leaseEntry, error) {
	out := make([]leaseEntry, 0, len(a)+len(b))
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && a[i].keyLess(b[j])):
			out = append(out, a[i])
			i++
		case i == len(a) || b[j].keyLess(a[i]):
			out = append(out, b[j])
			j++
		default:
			if b[j].beats(a[i]) {
				out = append(out, b[j])
			} else {
				out = append(out, a[i])
			}
			i++
			j++
		}
	}
	return out, nil
}

func joinTombs(a, b []Tombstone) []Tombstone {
	out := make([]Tombstone, 0, len(a)+len(b))
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && a[i].Owner < b[j].Owner):
			out = append(out, a[i])
			i++
		case i == len(a) || b[j].Owner < a[i].Owner:
			out = append(out, b[j])
			j++
		default:
			out = append(out, Tombstone{Owner: a[i].Owner, Version: max(a[i].Version, b[j].Version)})
			i++
			j++
		}
	}
	return out
}

func joinRaw(u universe, a, b []rawToken) []rawToken {
	out := make([]rawToken, 0, max(len(a), len(b)))
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && a[i].start.Less(b[j].start)):
			out = append(out, a[i])
			i++
		case i == len(a) || b[j].start.Less(a[i].start):
			out = append(out, b[j])
			j++
		default:
			if b[j].beats(a[i]) {
				out = append(out, b[j])
			} else {
				out = append(out, a[i])
			}
			i++
			j++
		}
	}
	return out
}

// Merge joins remote into r (the CRDT join). An invalid remote or one of
// another universe is refused with an error and r is left untouched. Merge
// does not know about allocations: Allocator.Merge is the guarded version a
// peer uses for its own ring.
func (r *Ring) Merge(remote *Ring) (changed bool, err error) {
	next, changed, err := r.tryMerge(remote)
	if err != nil || !changed {
		return false, err
	}
	r.commit(next)
	return true, nil
}

func (r *Ring) tryMerge(remote *Ring) (state, bool, error) {
	if remote == nil {
		return state{}, false, fmt.Errorf("%w: nil ring", ErrInvalid)
	}
	if remote.u != r.u {
		return state{}, false, fmt.Errorf("%w: %v, local ring is %v", ErrOtherUniverse, remote.u.prefix, r.u.prefix)
	}
	leases, err := joinLeases(r.st.leases, remote.st.leases)
	if err != nil {
		return state{}, false, err
	}
	tombs := joinTombs(r.st.tombs, remote.st.tombs)
	sets := joinTombs(r.st.sets, remote.st.sets)
	leases = normalize(leases, sets)
	raw := joinRaw(r.u, r.st.raw, remote.st.raw)
	if slices.Equal(raw, r.st.raw) && slices.Equal(leases, r.st.leases) && slices.Equal(sets, r.st.sets) && slices.Equal(tombs, r.st.tombs) {
		return state{}, false, nil
	}
	return r.derive(raw, leases, sets, tombs), true, nil
}
