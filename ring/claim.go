package ring

// Attributed claims: every raw token names its writer and carries the
// writer's signature of the token, and a token counts only while its
// writer leases its start (view.go, attributed). The ring signs and
// checks nothing itself: the holder gives it a signer (Allocator.SetSigner)
// and checks the signatures of what it receives (Admit's check).
//
// A claim is bound to its universe twice: Admit refuses a ring of another
// universe as a whole, and the bytes a receiver verifies name the
// receiver's own universe (claimBytes), so that a signature made in one
// overlay or family never verifies in another, whatever ring carries it.

import (
	"encoding/binary"
	"net/netip"
	"sort"
)

// claimDomain starts every claim's signed bytes, so that a signature of
// a claim is never a valid signature of anything else.
const claimDomain = "carve ring claim v1\x00"

// Claim is one raw token of a received ring, as its writer signed it.
type Claim struct {
	Start   netip.Addr
	Owner   string // "" for nobody
	Version uint64
	Free    Uint128
	// Signer is the peer that wrote the token ("" when it names none);
	// Sig its signature of Msg (empty when unsigned).
	Signer string
	Sig    []byte
	// Msg is what the signer must have signed for the token to join:
	// the receiver's universe and every field above but Sig
	// (claimBytes).
	Msg []byte
}

// Refusal is a received token Admit left out, and why.
type Refusal struct {
	Claim  Claim
	Reason string
	// Universe is the received ring's universe, for a refusal of
	// RefusedOtherUniverse (which names no token).
	Universe netip.Prefix
}

// Reasons of Admit's refusals of its own (the check adds its own).
const (
	// RefusedNotLessee: the signer does not lease the token's start in
	// the receiver's leases (a forged or over-reaching claim).
	RefusedNotLessee = "not_lessee"
	// RefusedRecordAhead: the token's version is newer than the
	// signer's lease set the receiver holds; it may be a lease the
	// receiver has not learned yet, and anti-entropy brings it again.
	RefusedRecordAhead = "record_ahead"
	// RefusedLease: a lease, lease set or tombstone: only the masters'
	// signed records carry those, never a peer's gossip.
	RefusedLease = "lease_from_gossip"
	// RefusedOtherUniverse: the received ring is of another overlay's
	// universe or another family (a misrouted message, or tokens
	// replayed from another overlay where the same offsets are leased):
	// it is refused as a whole, once, and no token of it is looked at.
	RefusedOtherUniverse = "other_universe"
)

// claimBytes is what the writer of a raw token signs: a fixed domain,
// the universe, and the token's start, owner, version, free count and
// signer, each length-prefixed or fixed-width. The universe is its
// address (4 bytes for IPv4, 16 for IPv6: the family) and its length, so
// the bytes of two universes always differ: a signature made in one never
// verifies in another. (An IPv4 token's start is below 2^32, so IPv4
// bytes read as IPv6 would name a universe of length 0, which no ring
// has, and the other way round: the address's length needs no tag.)
func claimBytes(u universe, t rawToken) []byte {
	b := make([]byte, 0, len(claimDomain)+64+len(t.owner)+len(t.signer))
	b = append(b, claimDomain...)
	b = append(b, u.prefix.Addr().AsSlice()...)
	b = append(b, byte(u.prefix.Bits()))
	b = binary.BigEndian.AppendUint64(b, t.start.Hi)
	b = binary.BigEndian.AppendUint64(b, t.start.Lo)
	b = binary.AppendUvarint(b, uint64(len(t.owner)))
	b = append(b, t.owner...)
	b = binary.BigEndian.AppendUint64(b, t.version)
	b = binary.BigEndian.AppendUint64(b, t.free.Hi)
	b = binary.BigEndian.AppendUint64(b, t.free.Lo)
	b = binary.AppendUvarint(b, uint64(len(t.signer)))
	b = append(b, t.signer...)
	return b
}

// signAll names self the writer of the tokens and signs them when the
// ring has a signer.
func (r *Ring) signAll(self string, writes []rawToken) []rawToken {
	for i := range writes {
		writes[i].signer, writes[i].sig = self, ""
		if r.sign != nil {
			writes[i].sig = string(r.sign(claimBytes(r.u, writes[i])))
		}
	}
	return writes
}

// SetSigner has the allocator sign every token it writes (grants,
// releases, free counts) with sign, which returns the signature of msg
// by this peer's claim key.
func (a *Allocator) SetSigner(sign func(msg []byte) []byte) { a.ring.sign = sign }

// claimOf is a raw token as a Claim.
func (r *Ring) claimOf(t rawToken) Claim {
	c := Claim{Start: r.u.addr(t.start), Owner: t.owner, Version: t.version, Free: t.free, Signer: t.signer, Msg: claimBytes(r.u, t)}
	if t.sig != "" {
		c.Sig = []byte(t.sig)
	}
	return c
}

// Admit returns what of a received ring r may join: the raw tokens whose
// signer passes check (its signature, under the key the holder trusts for
// it) and leases the token's start in r's own leases, at a version no
// newer than the signer's lease set r holds. Leases, lease sets and
// tombstones never come from a peer: r seeds them from the masters'
// records itself. Every entry of remote left out that r does not already
// hold is refused, with its reason; the empty first token is neither.
// A remote of another universe is refused whole (RefusedOtherUniverse):
// its tokens claim offsets of another overlay's space. The claims check
// sees are built over r's universe, never remote's.
func (r *Ring) Admit(remote *Ring, check func(Claim) (reason string, ok bool)) (*Ring, []Refusal) {
	if remote.u != r.u {
		return r.subset(nil, nil, nil, nil), []Refusal{{Reason: RefusedOtherUniverse, Universe: remote.u.prefix}}
	}
	return r.admitClaims(remote, check)
}

// admitClaims is Admit past the universe check. It reads remote's tokens
// as offsets in r's universe and has check verify the bytes of r's
// universe: a token signed in another stays refused even on a path that
// skipped the check (TestForgetfulAdmit).
func (r *Ring) admitClaims(remote *Ring, check func(Claim) (reason string, ok bool)) (*Ring, []Refusal) {
	var refused []Refusal
	var raw []rawToken
	for _, t := range remote.st.raw {
		if t == (rawToken{}) {
			continue
		}
		if r.holdsExactly(t) {
			raw = append(raw, t) // checked when it joined: no signature to verify again
			continue
		}
		c := r.claimOf(t) // over r's universe: what the signer must have signed to count here
		reason := ""
		switch set := tombIndex(r.st.sets, t.signer); {
		case t.signer != "" && set != 0 && t.version>>epochShift > set:
			// No lessee writes past its lease's index: either a lease
			// r has not learned yet, or a token forged never to be
			// voided by its writer's tombstone.
			reason = RefusedRecordAhead
		case t.signer == "" || lesseeAt(r.st.eff, t.start) != t.signer:
			reason = RefusedNotLessee
		default:
			if why, ok := check(c); !ok {
				reason = why
			}
		}
		if reason != "" {
			if !r.holdsRaw(t) {
				refused = append(refused, Refusal{Claim: c, Reason: reason})
			}
			continue
		}
		raw = append(raw, t)
	}
	if d, ok := remote.Delta(r); ok && len(d.st.leases)+len(d.st.sets)+len(d.st.tombs) > 0 {
		refused = append(refused, Refusal{Reason: RefusedLease})
	}
	return r.subset(raw, nil, nil, nil), refused
}

// holdsExactly reports whether r holds t itself.
func (r *Ring) holdsExactly(t rawToken) bool {
	i := sort.Search(len(r.st.raw), func(i int) bool { return !r.st.raw[i].start.Less(t.start) })
	return i < len(r.st.raw) && r.st.raw[i] == t
}

// holdsRaw reports whether r holds t, or a token that beats it, at t's
// position: a repeat of what r admitted before, not a new refusal.
func (r *Ring) holdsRaw(t rawToken) bool {
	i := sort.Search(len(r.st.raw), func(i int) bool { return !r.st.raw[i].start.Less(t.start) })
	return i < len(r.st.raw) && r.st.raw[i].start == t.start && (r.st.raw[i] == t || r.st.raw[i].beats(t))
}

// Sweep writes, over every token in this peer's effective leases that
// another peer wrote (which the view ignores), a token of its own with the
// view's owner there, so that it supersedes the other's everywhere: a
// grantee's return token once the masters gave the block back, or a grant
// of its own, older than that return, which a peer that missed the return
// still holds (it would count again now that this peer leases the space).
// The view does not change. A token it cannot outbid (a version at the
// counter's end) is left. changed reports whether anything was written.
func (a *Allocator) Sweep() (changed bool, err error) {
	r := a.ring
	self := a.self
	var writes []rawToken
	li := 0
	for _, t := range r.st.raw {
		if t == (rawToken{}) || t.signer == self {
			continue
		}
		for li < len(r.st.eff) && !t.start.Less(r.st.eff[li].end) {
			li++
		}
		if li == len(r.st.eff) || t.start.Less(r.st.eff[li].start) || r.st.eff[li].owner != self ||
			t.version>>epochShift > r.st.eff[li].index {
			continue // not in its lease; or no valid version of its own outbids it
		}
		i := find(r.st.view, t.start)
		v := r.st.view[i]
		w, err := bump(max(t.version, r.st.eff[li].index<<epochShift, v.version), 1)
		if err != nil {
			continue
		}
		free := minU(v.free, rangeEnd(r.u, r.st.view, i).Sub(t.start))
		if v.owner == "" {
			free = Uint128{}
		}
		writes = append(writes, rawToken{start: t.start, owner: v.owner, version: w, free: free})
	}
	if len(writes) == 0 {
		return false, nil
	}
	next := r.derive(upsert(r.u, r.st.raw, r.signAll(self, writes)...), r.st.leases, r.st.sets, r.st.tombs)
	if err := a.apply(next); err != nil {
		return false, err
	}
	return true, nil
}

// Resign writes again, signed with the current signer and one version
// up, every token this peer wrote in its own leases whose signature
// valid rejects (signed with a claim key it replaced): peers verify
// claims under the key of its current record only. changed reports
// whether anything was written.
func (a *Allocator) Resign(valid func(Claim) bool) (changed bool, err error) {
	r := a.ring
	var writes []rawToken
	for _, t := range r.st.raw {
		if t.signer != a.self || lesseeAt(r.st.eff, t.start) != a.self || valid(r.claimOf(t)) {
			continue
		}
		w, err := bump(t.version, 1)
		if err != nil {
			continue // cannot be outbid: it stays as signed
		}
		writes = append(writes, rawToken{start: t.start, owner: t.owner, version: w, free: t.free})
	}
	if len(writes) == 0 {
		return false, nil
	}
	next := r.derive(upsert(r.u, r.st.raw, r.signAll(a.self, writes)...), r.st.leases, r.st.sets, r.st.tombs)
	if err := a.apply(next); err != nil {
		return false, err
	}
	return true, nil
}
