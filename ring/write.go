package ring

// Owner writes: grants, releases and free counts.

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"sort"
)

// upsert writes tokens into a copy of raw. Free counts are left as their
// writers signed them: the view caps each at its range's size.
func upsert(u universe, raw []rawToken, writes ...rawToken) []rawToken {
	out := slices.Clone(raw)
	for _, w := range writes {
		i := sort.Search(len(out), func(i int) bool { return !out[i].start.Less(w.start) })
		if i < len(out) && out[i].start == w.start {
			out[i] = w
		} else {
			out = slices.Insert(out, i, w)
		}
	}
	return out
}

// bump returns the version one owner write after v.
func bump(v, step uint64) (uint64, error) {
	if v&counterMask > counterMask-step {
		return 0, fmt.Errorf("%w: version %d.%d", ErrVersionExhausted, v>>epochShift, v&counterMask)
	}
	return v + step, nil
}

// Grant gives the CIDR-aligned part p of the ranges owned by self to peer
// to: a whole range, its start, its end or a hole in the middle, or a span
// of consecutive ranges all self's and all in self's leases. It inserts at
// most two tokens, and rewrites the tokens at the ranges' starts so that
// their free counts stay possible. The free counts of self's remaining parts are estimates
// (the ring does not know where the allocations are): Allocator corrects them.
func (r *Ring) Grant(self, to string, p netip.Prefix) error {
	next, err := r.tryGrant(self, to, p)
	if err != nil {
		return err
	}
	r.commit(next)
	return nil
}

// Release gives the CIDR-aligned part p of the ranges owned by self (as for
// Grant) back to nobody (a grown block returned to the masters): a lease of
// a later index may then fill it, whatever free counts self wrote there
// before.
func (r *Ring) Release(self string, p netip.Prefix) error {
	next, err := r.tryGive(self, "", p)
	if err != nil {
		return err
	}
	r.commit(next)
	return nil
}

func (r *Ring) tryGrant(self, to string, p netip.Prefix) (state, error) {
	if to == "" {
		return state{}, fmt.Errorf("%w: grant from %q to nobody", ErrInvalid, self)
	}
	return r.tryGive(self, to, p)
}

// tryGive moves p from self to to ("" for nobody). p may span several
// consecutive ranges of the view (a block whole at the masters whose ring
// still holds a token inside it: Sweep's over a grant given back, a
// release filled again by a later lease, a free count of an older lease
// set): each must be self's and in self's lease. Tokens are
// never removed (the raw tokens join position by position), so the give
// writes to's token at p's start and at each range start inside p.
func (r *Ring) tryGive(self, to string, p netip.Prefix) (state, error) {
	if self == "" || self == to {
		return state{}, fmt.Errorf("%w: grant from %q to %q", ErrInvalid, self, to)
	}
	a, b, err := r.u.prefixSpan(p)
	if err != nil {
		return state{}, err
	}
	view := r.st.view
	first := find(view, a)
	last := first
	// Above the leases' indexes too, not only above the ranges' tokens:
	// the view gives a range of nobody to its lessee when the lease is
	// newer, and a lease set of a later record re-versions every lease of
	// the agent (a grow of another block), while a range's token may
	// still carry the epoch of the lease it was written under. A release
	// below the lease's index would be void: the range its own again,
	// handed out after a restart while the masters free it. One version
	// for every token written, above each of theirs.
	var top uint64
	for i := first; i < len(view) && view[i].start.Less(b); i++ {
		t := view[i]
		if t.owner != self {
			return state{}, fmt.Errorf("%w: %v is not inside ranges of %s (%v is %s's)", ErrNotOwner, p, self,
				r.u.addr(maxU(a, t.start)), cmp.Or(t.owner, "nobody"))
		}
		l := leaseAt(r.st.eff, t.start)
		if l.owner != self {
			// A token of anyone but the lessee changes nothing
			// (attributed): a grant not recorded by the masters yet
			// stays as its donor wrote it.
			return state{}, fmt.Errorf("%w: %v is %s's lease, not %s's (a grant the masters have not recorded yet)", ErrNotLessee, p, cmp.Or(l.owner, "nobody"), self)
		}
		top = max(top, t.version, l.index<<epochShift)
		last = i
	}
	w, err := bump(top, 1)
	if err != nil {
		return state{}, err
	}
	if d := tombIndex(r.st.tombs, to); to != "" && voids(d, w) {
		return state{}, fmt.Errorf("%w: %s at %d", ErrDeparted, to, d)
	}
	var writes []rawToken
	for i := first; i <= last; i++ {
		t := view[i]
		s, e := t.start, rangeEnd(r.u, view, i)
		lo, hi := maxU(a, s), minU(b, e) // the part of p in this range
		size := hi.Sub(lo)
		left := Uint128{}
		if size.Less(t.free) {
			left = t.free.Sub(size)
		}
		if to == "" {
			size = Uint128{} // nobody's ranges count nothing free
		}
		if lo != s { // only in the first range: self keeps its head
			f := minU(left, lo.Sub(s))
			left = left.Sub(f)
			writes = append(writes, rawToken{start: s, owner: self, version: w, free: f})
		}
		writes = append(writes, rawToken{start: lo, owner: to, version: w, free: size})
		if hi != e { // only in the last range: self keeps its tail
			writes = append(writes, rawToken{start: hi, owner: self, version: w, free: minU(left, e.Sub(hi))})
		}
	}
	return r.derive(upsert(r.u, r.st.raw, r.signAll(self, writes)...), r.st.leases, r.st.sets, r.st.tombs), nil
}

// ReportFree records the free count of ranges self owns, keyed by the
// range's first address; ranges not owned by self are ignored. Each changed
// count bumps its token's version, so that the news spreads.
func (r *Ring) ReportFree(self string, free map[netip.Addr]Uint128) (changed bool, err error) {
	next, changed, err := r.tryReportFree(self, free)
	if err != nil || !changed {
		return false, err
	}
	r.commit(next)
	return true, nil
}

func (r *Ring) tryReportFree(self string, free map[netip.Addr]Uint128) (state, bool, error) {
	var writes []rawToken
	for i, t := range r.st.view {
		if t.owner != self || self == "" || lesseeAt(r.st.eff, t.start) != self {
			continue // only the lessee's tokens count (attributed)
		}
		f, ok := free[r.u.addr(t.start)]
		if !ok {
			continue
		}
		f = minU(f, rangeEnd(r.u, r.st.view, i).Sub(t.start))
		if f == t.free {
			continue
		}
		w, err := bump(t.version, 1)
		if err != nil {
			return state{}, false, err
		}
		writes = append(writes, rawToken{start: t.start, owner: self, version: w, free: f})
	}
	if len(writes) == 0 {
		return state{}, false, nil
	}
	return r.derive(upsert(r.u, r.st.raw, r.signAll(self, writes)...), r.st.leases, r.st.sets, r.st.tombs), true, nil
}

// takeover finds the first part of self's ranges in cur that next gives to
// someone else while inUse reports allocations in it.
func takeover(u universe, cur, next []viewToken, self string, inUse func(Range) bool) error {
	if self == "" || inUse == nil {
		return nil
	}
	lost := subtract(coalesce(ownedIvals(u, cur, self)), coalesce(ownedIvals(u, next, self)))
	for _, l := range lost {
		// Split at next's tokens so that each part names its new owner.
		for i := find(next, l.lo); i < len(next) && !l.hi.Less(next[i].start); i++ {
			lo := maxU(l.lo, next[i].start)
			hi := minU(l.hi, rangeEnd(u, next, i).dec())
			rg := u.rangeOf(lo, hi)
			if inUse(rg) {
				return &TakeoverError{Peer: self, Range: rg, NewOwner: next[i].owner}
			}
		}
	}
	return nil
}
