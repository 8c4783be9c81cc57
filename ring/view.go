package ring

// The view: the ring queries see, derived from the replicated state.

import (
	"slices"
	"sort"
	"sync"
)

// ownerIndex lists, by owner, the positions of its tokens in a view. An
// agent asks for the blocks of every peer at each reconcile; scanning the
// whole view for each of them was quadratic in the cluster (the most of an
// idle agent's CPU at 5,000 agents, 4 times that at 10,000). Built once per
// state, on the first query, and shared by the state's clones, which may
// be read concurrently: hence the sync.Once.
type ownerIndex struct {
	once sync.Once
	pos  map[string][]int
}

// ownedBy returns the positions in view of peer's tokens, in address order.
func (x *ownerIndex) ownedBy(view []viewToken, peer string) []int {
	x.once.Do(func() {
		x.pos = map[string][]int{}
		for i, t := range view {
			if t.owner != "" {
				x.pos[t.owner] = append(x.pos[t.owner], i)
			}
		}
	})
	return x.pos[peer]
}

// ownedIvalsIndexed is ownedIvals(r.u, r.st.view, peer) through the
// state's owner index: it costs peer's tokens, not the view.
func (r *Ring) ownedIvalsIndexed(peer string) []ival {
	if peer == "" {
		return nil
	}
	view := r.st.view
	if r.st.owners == nil {
		return ownedIvals(r.u, view, peer) // a state not made by derive
	}
	idx := r.st.owners.ownedBy(view, peer)
	out := make([]ival, 0, len(idx))
	for _, i := range idx {
		out = append(out, ival{view[i].start, rangeEnd(r.u, view, i).dec()})
	}
	return out
}

// normalize drops the leases below their agent's lease-set version: a
// function of the joined state, so the join stays a join.
func normalize(leases []leaseEntry, sets []Tombstone) []leaseEntry {
	if len(sets) == 0 {
		return leases
	}
	out := make([]leaseEntry, 0, len(leases))
	for _, l := range leases {
		if l.index >= tombIndex(sets, l.owner) {
			out = append(out, l)
		}
	}
	return out
}

// effectiveLeases resolves overlapping leases: each address goes to the
// covering lease of the highest index (then the greatest owner). The result
// is sorted and disjoint; without overlaps it is the leases themselves.
func effectiveLeases(leases []leaseEntry) []leaseEntry {
	overlap := false
	for k := 1; k < len(leases); k++ {
		if leases[k].start.Less(leases[k-1].end) {
			overlap = true
			break
		}
	}
	if !overlap {
		return leases
	}
	byRank := slices.Clone(leases)
	slices.SortStableFunc(byRank, func(a, b leaseEntry) int {
		switch {
		case a.beats(b):
			return -1
		case b.beats(a):
			return 1
		case a.keyLess(b):
			return -1
		case b.keyLess(a):
			return 1
		}
		return 0
	})
	var painted []leaseEntry // sorted by start, disjoint
	for _, l := range byRank {
		x := l.start
		i := sort.Search(len(painted), func(i int) bool { return x.Less(painted[i].end) })
		for x.Less(l.end) {
			if i == len(painted) || !painted[i].start.Less(l.end) {
				painted = slices.Insert(painted, i, leaseEntry{start: x, end: l.end, bits: l.bits, owner: l.owner, index: l.index})
				break
			}
			if x.Less(painted[i].start) {
				painted = slices.Insert(painted, i, leaseEntry{start: x, end: painted[i].start, bits: l.bits, owner: l.owner, index: l.index})
				i++
			}
			x = painted[i].end
			i++
		}
	}
	return painted
}

func tombIndex(tombs []Tombstone, owner string) uint64 {
	i := sort.Search(len(tombs), func(i int) bool { return tombs[i].Owner >= owner })
	if i < len(tombs) && tombs[i].Owner == owner {
		return tombs[i].Version
	}
	return 0
}

// voids reports whether a tombstone of index d voids a version.
func voids(d, version uint64) bool { return d != 0 && d > version>>epochShift }

// attributed keeps the raw tokens the view uses: each written by the
// lessee of its start (leases: the effective ones, sorted and disjoint),
// and the empty token at the universe's start, which claims nothing. A
// deleted lessee's grants still count until its space is leased again
// (the masters' quarantine waits for them to be reported); its own
// ranges are voided by its tombstone as before. A token of any other writer (a
// peer that lost the space since, or never held it) changes nothing,
// whatever its version. The result starts at offset 0.
func attributed(raw []rawToken, leases []leaseEntry) []rawToken {
	out := raw[:0:0]
	li := 0
	for _, t := range raw {
		if t == (rawToken{}) {
			out = append(out, t)
			continue
		}
		for li < len(leases) && !t.start.Less(leases[li].end) {
			li++
		}
		if t.signer == "" || li == len(leases) || t.start.Less(leases[li].start) || leases[li].owner != t.signer {
			continue
		}
		out = append(out, t)
	}
	if len(out) == 0 || !out[0].start.IsZero() {
		out = slices.Insert(out, 0, rawToken{})
	}
	return out
}

// lesseeAt returns the lessee of offset x in leases (effective: sorted and
// disjoint), "" when none.
func lesseeAt(leases []leaseEntry, x Uint128) string { return leaseAt(leases, x).owner }

// leaseAt returns the lease of offset x in leases (effective: sorted and
// disjoint), the zero entry when none.
func leaseAt(leases []leaseEntry, x Uint128) leaseEntry {
	i := sort.Search(len(leases), func(i int) bool { return x.Less(leases[i].end) })
	if i < len(leases) && !x.Less(leases[i].start) {
		return leases[i]
	}
	return leaseEntry{}
}

// computeView derives the ring queries see from the replicated state: the
// attributed raw tokens, the leases and the tombstones.
func computeView(u universe, raw []rawToken, leases []leaseEntry, tombs []Tombstone) []viewToken {
	raw = attributed(raw, leases)
	// Lease boundaries: non-decreasing because leases are sorted and
	// disjoint.
	bounds := make([]Uint128, 0, 2*len(leases))
	for _, l := range leases {
		for _, b := range [2]Uint128{l.start, l.end} {
			if b.Less(u.size) && (len(bounds) == 0 || bounds[len(bounds)-1] != b) {
				bounds = append(bounds, b)
			}
		}
	}
	view := make([]viewToken, 0, len(raw)+len(bounds))
	whole := make([]bool, 0, cap(view))
	ri, bi, li := 0, 0, 0
	for ri < len(raw) || bi < len(bounds) {
		var v viewToken
		switch {
		case bi == len(bounds) || (ri < len(raw) && raw[ri].start.Less(bounds[bi])):
			v.rawToken = raw[ri]
			ri++
		case ri < len(raw) && raw[ri].start == bounds[bi]:
			v.rawToken = raw[ri]
			ri++
			bi++
		default:
			// A lease boundary nobody wrote a token at: it starts
			// from nothing, so a range never spills over a subnet
			// boundary.
			v.start = bounds[bi]
			bi++
		}
		x := v.start
		if v.owner != "" {
			if d := tombIndex(tombs, v.owner); voids(d, v.version) {
				v = viewToken{rawToken: rawToken{start: x, version: d << epochShift}, voided: v.owner}
			}
		}
		for li < len(leases) && !x.Less(leases[li].end) {
			li++
		}
		isWhole := false
		if v.owner == "" && li < len(leases) && !x.Less(leases[li].start) {
			l := leases[li]
			if lv := l.index << epochShift; lv > v.version {
				if d := tombIndex(tombs, l.owner); voids(d, lv) {
					if dv := d << epochShift; dv > v.version {
						v = viewToken{rawToken: rawToken{start: x, version: dv}, voided: l.owner}
					}
				} else {
					v = viewToken{rawToken: rawToken{start: x, owner: l.owner, version: lv}}
					isWhole = true
				}
			}
		}
		if v.owner == "" {
			v.free = Uint128{}
		}
		view = append(view, v)
		whole = append(whole, isWhole)
	}
	for i := range view {
		size := rangeEnd(u, view, i).Sub(view[i].start)
		if whole[i] {
			view[i].free = size
		} else {
			view[i].free = minU(view[i].free, size)
		}
	}
	return view
}

// rangeEnd is the exclusive end offset of token i's range.
func rangeEnd[T interface{ pos() Uint128 }](u universe, toks []T, i int) Uint128 {
	if i+1 < len(toks) {
		return toks[i+1].pos()
	}
	return u.size
}

func (t rawToken) pos() Uint128  { return t.start }
func (t viewToken) pos() Uint128 { return t.start }
