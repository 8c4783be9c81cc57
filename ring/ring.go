// Package ring is the ring CRDT of address ranges of one overlay, and the
// address space inside the ranges one peer owns.
//
// # The ring
//
// The universe (the overlay subnet, IPv4 or IPv6) is cut into ranges by
// tokens; a range runs from its token to the next one, and the last range
// runs to the end of the universe (a ring always holds a token at the first
// address, so the wrap-around is empty). Each token carries an owner (an
// agent id, or "" for nobody), a version and a free count (a hint of how many
// addresses its owner has left in the range).
//
// The replicated state has three parts, each a join-semilattice:
//
//   - raw tokens: the tokens peers wrote (grants, releases, free counts),
//     joined position by position, the greater value winning;
//   - leases: the master's lease table (agent -> blocks, with the Raft index
//     of the record they come from), joined by (prefix, agent), the higher
//     index winning, and per agent a lease-set version: an agent's complete
//     lease set at a version (SeedSets) replaces its leases of lower index,
//     so that a block it gave back or granted away drops out;
//   - tombstones: agents deleted at the master, with the Raft index of the
//     deletion, joined by agent, the higher index winning.
//
// The ring every query sees (the view) is a pure function of the three: a
// token of a deleted agent older than its deletion belongs to nobody, and a
// range that belongs to nobody inside a leased subnet belongs to the lessee
// when the lease is newer. Leases of two agents may overlap (a donor's older
// block and the block a grant moved to the recipient, recorded later): where
// they do, the lease of the higher index wins (then the greater agent id).
// Peers that hold the same three parts therefore see
// the same ring, and a merge is the join of the parts: commutative,
// associative and idempotent. Values at one position are ordered by version,
// then owner, then free count (the lower count wins), so ties are broken the
// same way everywhere.
//
// A version is a Raft index (the epoch, upper 32 bits) and a local counter
// (lower 32 bits): a lease of index i gives version i<<32; an owner's write
// (grant, free count) adds 1; and a tombstone of index d voids every token
// of its agent whose epoch is below d.
//
// # The space
//
// The space of a peer holds the ranges it owns and, inside them, which
// addresses are free. Allocator ties a Ring and a space for one peer and keeps them equal
// after every operation, and hands out addresses idempotently per
// (container, interface). Nothing in this package does I/O or locking.
package ring

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
)

const (
	epochShift   = 32
	counterMask  = 1<<epochShift - 1
	maxRaftIndex = 1<<epochShift - 1
)

// Lease is one line of the master's lease table for this overlay.
type Lease struct {
	Owner   string       // agent id
	Prefix  netip.Prefix // agent subnet, inside the universe
	Version uint64       // Raft index at which the lease was committed
}

// LeaseSet is one agent's complete lease table in the universe, at the
// version (Raft index) of the master record it comes from: seeding it
// replaces every lease of that agent of a lower index, so that blocks the
// agent gave back or granted away leave the ring.
type LeaseSet struct {
	Owner    string
	Version  uint64
	Prefixes []netip.Prefix
}

// Tombstone says the master deleted an agent at a Raft index: every range it
// held with an older version returns to no owner.
type Tombstone struct {
	Owner   string
	Version uint64 // Raft index of the deletion
}

// Token is one token of the view: the start of a range, its owner ("" for
// nobody), version and free count.
type Token struct {
	Start   netip.Addr
	Owner   string
	Version uint64
	Free    Uint128
}

type rawToken struct {
	start   Uint128
	owner   string
	version uint64
	free    Uint128
}

// beats reports whether a wins over b at the same position: a total order,
// so that every peer keeps the same value whatever the delivery order.
func (a rawToken) beats(b rawToken) bool {
	if a.version != b.version {
		return a.version > b.version
	}
	if a.owner != b.owner {
		return a.owner > b.owner
	}
	// Lower free count wins: the conservative guess when two writes
	// disagree, and it commutes with clamping to the range size.
	return a.free.Less(b.free)
}

type leaseEntry struct {
	start, end Uint128 // offsets [start, end)
	bits       int
	owner      string
	index      uint64
}

func (a leaseEntry) keyLess(b leaseEntry) bool {
	if a.start != b.start {
		return a.start.Less(b.start)
	}
	if a.bits != b.bits {
		return a.bits < b.bits
	}
	return a.owner < b.owner
}

func (a leaseEntry) sameKey(b leaseEntry) bool {
	return a.start == b.start && a.bits == b.bits && a.owner == b.owner
}

func (a leaseEntry) beats(b leaseEntry) bool {
	if a.index != b.index {
		return a.index > b.index
	}
	return a.owner > b.owner
}

type viewToken struct {
	rawToken
	voided string // owner whose tombstone emptied this range, for a takeover (tests)
}

// state is the replicated state and the view derived from it. Slices are
// never modified in place once built: operations build the next state, check
// it, then swap it in, so a refused change leaves nothing behind.
type state struct {
	raw    []rawToken
	leases []leaseEntry
	// sets are the lease-set versions by agent: no lease of an agent has
	// a lower index than its set's (normalize drops them).
	sets  []Tombstone
	tombs []Tombstone
	view  []viewToken
	// owners indexes view by owner, built on first use (see ownerIndex).
	owners *ownerIndex
}

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

// Ring is the ring of one overlay. It is not safe for concurrent use.
type Ring struct {
	u       universe
	st      state
	changes uint64
}

// NewRing returns a ring of the universe in which nobody owns anything.
func NewRing(universe netip.Prefix) (*Ring, error) {
	u, err := newUniverse(universe)
	if err != nil {
		return nil, err
	}
	r := &Ring{u: u}
	r.st = r.derive([]rawToken{{}}, nil, nil, nil)
	return r, nil
}

func (r *Ring) derive(raw []rawToken, leases []leaseEntry, sets, tombs []Tombstone) state {
	return state{raw: raw, leases: leases, sets: sets, tombs: tombs, view: computeView(r.u, raw, effectiveLeases(leases), tombs),
		owners: &ownerIndex{}}
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

// computeView derives the ring queries see from the replicated state.
func computeView(u universe, raw []rawToken, leases []leaseEntry, tombs []Tombstone) []viewToken {
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

// clampRaw caps every free count at its raw range size. Applied after every
// change of the token set, it keeps the state valid, and it commutes with the
// join because the join prefers the lower count on ties.
func clampRaw(u universe, raw []rawToken) {
	for i := range raw {
		raw[i].free = minU(raw[i].free, rangeEnd(u, raw, i).Sub(raw[i].start))
	}
}

// Universe is the address space of the ring.
func (r *Ring) Universe() netip.Prefix { return r.u.prefix }

// Changes counts the changes applied to r, so that a holder can tell cheaply
// whether there is something new to gossip.
func (r *Ring) Changes() uint64 { return r.changes }

func (r *Ring) commit(next state) {
	r.st = next
	r.changes++
}

// Clone returns an independent copy of r.
func (r *Ring) Clone() *Ring {
	c := *r
	return &c // slices are never modified in place, sharing them is safe
}

// Equal reports whether r and o hold the same replicated state.
func (r *Ring) Equal(o *Ring) bool {
	return r.u == o.u && slices.Equal(r.st.raw, o.st.raw) && slices.Equal(r.st.leases, o.st.leases) &&
		slices.Equal(r.st.sets, o.st.sets) && slices.Equal(r.st.tombs, o.st.tombs)
}

// Tokens returns the view: the tokens queries see, in address order.
func (r *Ring) Tokens() []Token {
	out := make([]Token, len(r.st.view))
	for i, t := range r.st.view {
		out[i] = Token{Start: r.u.addr(t.start), Owner: t.owner, Version: t.version, Free: t.free}
	}
	return out
}

// Leases returns the lease table the ring holds, in address order (then
// prefix length, then owner); leases may overlap (see the package doc).
func (r *Ring) Leases() []Lease {
	out := make([]Lease, len(r.st.leases))
	for i, l := range r.st.leases {
		out[i] = Lease{Owner: l.owner, Prefix: netip.PrefixFrom(r.u.addr(l.start), l.bits), Version: l.index}
	}
	return out
}

// Tombstones returns the tombstones the ring holds, by agent id.
func (r *Ring) Tombstones() []Tombstone { return slices.Clone(r.st.tombs) }

// String lists the view's tokens as start=owner/epoch.counter/free, for
// logs and test failures.
func (r *Ring) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "ring %v:", r.u.prefix)
	for _, t := range r.Tokens() {
		owner := t.Owner
		if owner == "" {
			owner = "-"
		}
		fmt.Fprintf(&b, " %v=%s/%d.%d/%v", t.Start, owner, t.Version>>epochShift, t.Version&counterMask, t.Free)
	}
	return b.String()
}

// find returns the index of the view token whose range holds offset x.
func find(view []viewToken, x Uint128) int {
	return sort.Search(len(view), func(i int) bool { return x.Less(view[i].start) }) - 1
}

// Owner returns the owner of a ("" for nobody); ok is false when a lies
// outside the universe.
func (r *Ring) Owner(a netip.Addr) (owner string, ok bool) {
	x, ok := r.u.offset(a)
	if !ok {
		return "", false
	}
	return r.st.view[find(r.st.view, x)].owner, true
}

func ownedIvals(u universe, view []viewToken, peer string) []ival {
	var out []ival
	if peer == "" {
		return nil
	}
	for i, t := range view {
		if t.owner == peer {
			out = append(out, ival{t.start, rangeEnd(u, view, i).dec()})
		}
	}
	return out
}

// Peers returns every peer that owns a range, sorted.
func (r *Ring) Peers() []string {
	seen := map[string]bool{}
	var out []string
	for _, t := range r.st.view {
		if t.owner != "" && !seen[t.owner] {
			seen[t.owner] = true
			out = append(out, t.owner)
		}
	}
	sort.Strings(out)
	return out
}

// freeByPeer sums the free counts of every owner's ranges.
func (r *Ring) freeByPeer() map[string]Uint128 {
	out := map[string]Uint128{}
	for _, t := range r.st.view {
		if t.owner != "" {
			out[t.owner] = out[t.owner].Add(t.free)
		}
	}
	return out
}

// ChoosePeerToAsk picks the peer to ask for space: at random, each peer with
// a probability exactly proportional to its free count, leaving out the
// excluded peers (this peer, peers that refused) and peers with nothing free.
// ok is false when no peer qualifies.
func (r *Ring) ChoosePeerToAsk(rng *rand.Rand, exclude ...string) (peer string, ok bool) {
	free := r.freeByPeer()
	names := make([]string, 0, len(free))
	var sum Uint128
	for p, f := range free {
		if f.IsZero() || slices.Contains(exclude, p) {
			continue
		}
		names = append(names, p)
		sum = sum.Add(f)
	}
	if len(names) == 0 {
		return "", false
	}
	sort.Strings(names) // map order must not leak into the draw
	x := randBelow(rng, sum)
	for _, p := range names {
		f := free[p]
		if x.Less(f) {
			return p, true
		}
		x = x.Sub(f)
	}
	return names[len(names)-1], true // unreachable: x < sum
}

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
	clampRaw(u, out)
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

// upsert writes tokens into a copy of raw, then clamps free counts.
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
	clampRaw(u, out)
	return out
}

// bump returns the version one owner write after v.
func bump(v, step uint64) (uint64, error) {
	if v&counterMask > counterMask-step {
		return 0, fmt.Errorf("%w: version %d.%d", ErrVersionExhausted, v>>epochShift, v&counterMask)
	}
	return v + step, nil
}

// Grant gives the CIDR-aligned part p of a range owned by self to peer to:
// the whole range, its start, its end or a hole in the middle. It inserts at
// most two tokens, and rewrites the range's own token so that its free count
// stays possible. The free counts of self's remaining parts are estimates
// (the ring does not know where the allocations are): Allocator corrects them.
func (r *Ring) Grant(self, to string, p netip.Prefix) error {
	next, err := r.tryGrant(self, to, p)
	if err != nil {
		return err
	}
	r.commit(next)
	return nil
}

// Release gives the CIDR-aligned part p of a range owned by self back to
// nobody (a grown block returned to the masters): a lease of a later index
// may then fill it, whatever free counts self wrote there before.
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

// tryGive moves p from self to to ("" for nobody).
func (r *Ring) tryGive(self, to string, p netip.Prefix) (state, error) {
	if self == "" || self == to {
		return state{}, fmt.Errorf("%w: grant from %q to %q", ErrInvalid, self, to)
	}
	a, b, err := r.u.prefixSpan(p)
	if err != nil {
		return state{}, err
	}
	view := r.st.view
	i := find(view, a)
	t := view[i]
	s, e := t.start, rangeEnd(r.u, view, i)
	if t.owner != self || e.Less(b) {
		return state{}, fmt.Errorf("%w: %v is not inside one range of %s", ErrNotOwner, p, self)
	}
	w, err := bump(t.version, 1)
	if err != nil {
		return state{}, err
	}
	if d := tombIndex(r.st.tombs, to); to != "" && voids(d, w) {
		return state{}, fmt.Errorf("%w: %s at %d", ErrDeparted, to, d)
	}
	size := b.Sub(a)
	if to == "" {
		size = Uint128{} // nobody's ranges count nothing free
	}
	left := Uint128{}
	if size.Less(t.free) {
		left = t.free.Sub(size)
	}
	var writes []rawToken
	if a == s {
		writes = append(writes, rawToken{start: s, owner: to, version: w, free: size})
	} else {
		f1 := minU(left, a.Sub(s))
		left = left.Sub(f1)
		writes = append(writes,
			rawToken{start: s, owner: self, version: w, free: f1},
			rawToken{start: a, owner: to, version: w, free: size})
	}
	if b != e {
		writes = append(writes, rawToken{start: b, owner: self, version: w, free: minU(left, e.Sub(b))})
	}
	return r.derive(upsert(r.u, r.st.raw, writes...), r.st.leases, r.st.sets, r.st.tombs), nil
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
		if t.owner != self || self == "" {
			continue
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
	return r.derive(upsert(r.u, r.st.raw, writes...), r.st.leases, r.st.sets, r.st.tombs), true, nil
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

// Blocks covers the ranges peer owns with the fewest CIDR prefixes
// (adjacent ranges joined), in address order: what routes to the peer need.
func (r *Ring) Blocks(peer string) []netip.Prefix {
	var out []netip.Prefix
	for _, v := range coalesce(r.ownedIvalsIndexed(peer)) {
		out = append(out, r.u.rangeOf(v.lo, v.hi).Prefixes()...)
	}
	return out
}
