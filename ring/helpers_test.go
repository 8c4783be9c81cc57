package ring

import (
	"net/netip"
	"testing"
)

func pfx(t testing.TB, s string) netip.Prefix {
	t.Helper()
	p, err := netip.ParsePrefix(s)
	if err != nil {
		t.Fatalf("parse prefix %q: %v", s, err)
	}
	return p
}

func ip(t testing.TB, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatalf("parse addr %q: %v", s, err)
	}
	return a
}

func newRing(t testing.TB, universe string) *Ring {
	t.Helper()
	r, err := NewRing(pfx(t, universe))
	if err != nil {
		t.Fatalf("NewRing(%s): %v", universe, err)
	}
	return r
}

// tok describes a raw token for tests: start address, owner, epoch,
// counter, free count.
type tok struct {
	start   string
	owner   string
	epoch   uint64
	counter uint64
	free    uint64
}

// rawRing builds a ring straight from raw tokens, as a remote peer might have
// it, and checks that it is a valid state. Each token names its owner as
// its writer; the view uses it only where that owner leases its start.
func rawRing(t testing.TB, universe string, toks ...tok) *Ring {
	t.Helper()
	r := newRing(t, universe)
	raw := make([]rawToken, 0, len(toks))
	for _, k := range toks {
		x, ok := r.u.offset(ip(t, k.start))
		if !ok {
			t.Fatalf("token %s outside %s", k.start, universe)
		}
		raw = append(raw, rawToken{start: x, owner: k.owner, version: k.epoch<<epochShift | k.counter, free: U128(k.free), signer: k.owner})
	}
	r.st = r.derive(raw, nil, nil, nil)
	if _, err := Decode(r.Encode()); err != nil {
		t.Fatalf("test ring is invalid: %v", err)
	}
	return r
}

func mustSeed(t testing.TB, r *Ring, leases []Lease, tombs []Tombstone) {
	t.Helper()
	if _, err := r.Seed(leases, tombs); err != nil {
		t.Fatalf("seed: %v", err)
	}
}

func mustSeedSets(t testing.TB, r *Ring, sets []LeaseSet) {
	t.Helper()
	if _, err := r.SeedSets(sets, nil); err != nil {
		t.Fatalf("seed sets: %v", err)
	}
	checkValid(t, r)
}

func ownerOf(t testing.TB, r *Ring, a string) string {
	t.Helper()
	o, ok := r.Owner(ip(t, a))
	if !ok {
		t.Fatalf("%s outside %v", a, r.Universe())
	}
	return o
}

// checkValid fails when r's encoding does not decode to r.
func checkValid(t testing.TB, r *Ring) {
	t.Helper()
	b := r.Encode()
	d, err := Decode(b)
	if err != nil {
		t.Fatalf("ring no longer valid: %v\n%v", err, r)
	}
	if !d.Equal(r) {
		t.Fatalf("decode(encode(r)) != r\n%v\n%v", r, d)
	}
}

func mustAllocator(t testing.TB, self, universe string) *Allocator {
	t.Helper()
	a, err := NewAllocator(self, pfx(t, universe))
	if err != nil {
		t.Fatalf("NewAllocator: %v", err)
	}
	return a
}

// checkInvariant fails unless the ranges the ring gives the allocator's peer
// are those its space holds, and every allocation is owned and in use.
func checkInvariant(t testing.TB, a *Allocator) {
	t.Helper()
	want := a.ring.RangesOf(a.self)
	got := a.space.Owned()
	if len(want) != len(got) {
		t.Fatalf("%s: ring ranges %v, space ranges %v", a.self, want, got)
	}
	for i := range want {
		if want[i] != got[i] {
			t.Fatalf("%s: ring ranges %v, space ranges %v", a.self, want, got)
		}
	}
	for _, al := range a.Allocations() {
		if o, _ := a.ring.Owner(al.Addr); o != a.self {
			t.Fatalf("%s: allocation %v in a range of %q", a.self, al, o)
		}
		if a.space.IsFree(al.Addr) {
			t.Fatalf("%s: allocation %v is free in the space", a.self, al)
		}
	}
	checkValid(t, a.ring)
}

// give releases p (to "") or grants it to to.
func give(r *Ring, self, to string, p netip.Prefix) error {
	if to == "" {
		return r.Release(self, p)
	}
	return r.Grant(self, to, p)
}
