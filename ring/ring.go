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
// (container, interface), round-robin in each subnet (a freed address comes
// back last). Nothing in this package does I/O or locking.
package ring

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sort"
	"strings"
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
	// signer is the peer that wrote the token, sig its signature of the
	// token's claim bytes (claim.go; empty when the writer signs nothing).
	// The view uses a token only while its signer is the lessee of its
	// start.
	signer string
	sig    string
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
	// disagree. (Raw counts are never clamped, which would void their
	// writer's signature: the view caps them at their range's size.)
	if a.free != b.free {
		return a.free.Less(b.free)
	}
	if a.signer != b.signer {
		return a.signer > b.signer
	}
	return a.sig > b.sig
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
	// eff are the effective leases (effectiveLeases): who leases each
	// address, what decides which raw tokens the view uses.
	eff  []leaseEntry
	view []viewToken
	// owners indexes view by owner, built on first use (see ownerIndex).
	owners *ownerIndex
}

// Ring is the ring of one overlay. It is not safe for concurrent use.
type Ring struct {
	u       universe
	st      state
	changes uint64
	// sign, when set, signs the claim bytes of the tokens this ring's
	// owner writes (SetSigner); not replicated.
	sign func(msg []byte) []byte
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
	eff := effectiveLeases(leases)
	return state{raw: raw, leases: leases, sets: sets, tombs: tombs, eff: eff, view: computeView(r.u, raw, eff, tombs),
		owners: &ownerIndex{}}
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

// Blocks covers the ranges peer owns with the fewest CIDR prefixes
// (adjacent ranges joined), in address order: what routes to the peer need.
func (r *Ring) Blocks(peer string) []netip.Prefix {
	var out []netip.Prefix
	for _, v := range coalesce(r.ownedIvalsIndexed(peer)) {
		out = append(out, r.u.rangeOf(v.lo, v.hi).Prefixes()...)
	}
	return out
}
