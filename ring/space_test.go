package ring

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

func testSpace(t testing.TB, universe string, owned ...string) *space {
	t.Helper()
	s, err := newSpace(pfx(t, universe))
	if err != nil {
		t.Fatal(err)
	}
	var ranges []Range
	for _, o := range owned {
		p := pfx(t, o)
		ranges = append(ranges, Range{p.Addr(), lastAddr(p)})
	}
	if err := s.SetOwned(ranges); err != nil {
		t.Fatalf("SetOwned: %v", err)
	}
	return s
}

func lastAddr(p netip.Prefix) netip.Addr {
	u, _ := newUniverse(p)
	return u.addr(u.size.dec())
}

func TestSpaceAllocate(t *testing.T) {
	tests := []struct {
		name     string
		universe string
		owned    []string
		claimed  []string
		subnet   string
		want     []string // successive allocations; "" for ErrFull
	}{
		{"lowest first, no network nor gateway", "10.0.0.0/16", []string{"10.0.1.0/24"}, nil, "10.0.1.0/25",
			[]string{"10.0.1.2", "10.0.1.3", "10.0.1.4"}},
		{"second half bridge", "10.0.0.0/16", []string{"10.0.1.0/24"}, nil, "10.0.1.128/25",
			[]string{"10.0.1.130", "10.0.1.131"}},
		{"starts after the highest in use", "10.0.0.0/16", []string{"10.0.1.0/24"}, []string{"10.0.1.2", "10.0.1.4"}, "10.0.1.0/24",
			[]string{"10.0.1.5", "10.0.1.6"}},
		{"wraps to the holes", "10.0.0.0/16", []string{"10.0.1.0/24"}, []string{"10.0.1.2", "10.0.1.4", "10.0.1.6"}, "10.0.1.0/29",
			[]string{"10.0.1.3", "10.0.1.5", ""}},
		{"last host in use: wraps", "10.0.0.0/16", []string{"10.0.1.0/24"}, []string{"10.0.1.3", "10.0.1.6"}, "10.0.1.0/29",
			[]string{"10.0.1.2", "10.0.1.4", "10.0.1.5", ""}},
		{"no broadcast in IPv4", "10.0.0.0/16", []string{"10.0.1.0/24"}, nil, "10.0.1.0/30",
			[]string{"10.0.1.2", ""}},
		{"/31 has no host", "10.0.0.0/16", []string{"10.0.1.0/24"}, nil, "10.0.1.0/31", []string{""}},
		{"IPv6 keeps its last address", "fd00::/48", []string{"fd00:0:0:1::/64"}, nil, "fd00:0:0:1::/126",
			[]string{"fd00:0:0:1::2", "fd00:0:0:1::3", ""}},
		{"only owned addresses", "10.0.0.0/16", []string{"10.0.1.128/25"}, nil, "10.0.1.0/24",
			[]string{"10.0.1.128", "10.0.1.129"}},
		{"nothing owned", "10.0.0.0/16", nil, nil, "10.0.1.0/24", []string{""}},
		{"across two ranges", "10.0.0.0/16", []string{"10.0.1.0/25", "10.0.1.128/25"}, nil, "10.0.1.124/30",
			[]string{"10.0.1.126", ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := testSpace(t, tt.universe, tt.owned...)
			for _, c := range tt.claimed {
				if err := s.Claim(ip(t, c)); err != nil {
					t.Fatal(err)
				}
			}
			var last netip.Addr
			for i, w := range tt.want {
				got, err := s.AllocateAfter(pfx(t, tt.subnet), last)
				if err == nil {
					last = got
				}
				if w == "" {
					if !errors.Is(err, ErrFull) {
						t.Fatalf("allocation %d = %v, %v; want ErrFull", i, got, err)
					}
					continue
				}
				if err != nil || got != ip(t, w) {
					t.Fatalf("allocation %d = %v, %v; want %s", i, got, err, w)
				}
			}
		})
	}
}

func TestSpaceClaimRelease(t *testing.T) {
	s := testSpace(t, "10.0.0.0/16", "10.0.1.0/24", "10.0.2.0/24")
	a := ip(t, "10.0.1.9")
	if err := s.Claim(a); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		op   func() error
		want error
	}{
		{"claim in use", func() error { return s.Claim(a) }, ErrAddressInUse},
		{"claim not owned", func() error { return s.Claim(ip(t, "10.0.3.1")) }, ErrNotOwned},
		{"claim outside", func() error { return s.Claim(ip(t, "10.1.0.1")) }, ErrOutside},
		{"claim other family", func() error { return s.Claim(ip(t, "fd00::1")) }, ErrOutside},
		{"release free", func() error { return s.Release(ip(t, "10.0.1.10")) }, ErrNotAllocated},
		{"release not owned", func() error { return s.Release(ip(t, "10.0.3.1")) }, ErrNotOwned},
		{"release", func() error { return s.Release(a) }, nil},
		{"release twice", func() error { return s.Release(a) }, ErrNotAllocated},
	}
	for _, tt := range tests {
		if err := tt.op(); !errors.Is(err, tt.want) {
			t.Fatalf("%s = %v, want %v", tt.name, err, tt.want)
		}
	}
	if s.FreeCount() != U128(512) {
		t.Fatalf("free = %v, want 512", s.FreeCount())
	}
	// Releasing the last address of a range next to a free first
	// address of the next range must not join runs across ranges.
	for _, c := range []string{"10.0.1.255", "10.0.2.0"} {
		if err := s.Claim(ip(t, c)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Release(ip(t, "10.0.2.0")); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ip(t, "10.0.1.255")); err != nil {
		t.Fatal(err)
	}
	if got := s.FreeByRange(); got[ip(t, "10.0.1.0")] != U128(256) || got[ip(t, "10.0.2.0")] != U128(256) {
		t.Fatalf("FreeByRange = %v", got)
	}
	for _, f := range s.free {
		if o := s.ownedAt(f.lo); o < 0 || s.owned[o].hi.Less(f.hi) {
			t.Fatalf("free run %v crosses a range boundary: owned %v", f, s.owned)
		}
	}
}

// TestSpaceModel runs random operations against a map model of the same
// space and compares every answer.
func TestSpaceModel(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			s := testSpace(t, "10.0.0.0/16", "10.0.1.0/26", "10.0.1.64/26", "10.0.2.0/25")
			owned := map[netip.Addr]bool{}
			for _, r := range s.Owned() {
				for a := r.First; a.Compare(r.Last) <= 0; a = a.Next() {
					owned[a] = true
				}
			}
			used := map[netip.Addr]bool{}
			lastOf := map[netip.Prefix]netip.Addr{} // round-robin: the last handed out per subnet
			subnets := []string{"10.0.1.0/25", "10.0.2.0/25", "10.0.1.64/27", "10.0.0.0/22"}
			for step := range 3000 {
				switch op := rng.IntN(3); op {
				case 0:
					sub := pfx(t, subnets[rng.IntN(len(subnets))])
					got, err := s.AllocateAfter(sub, lastOf[sub])
					want := modelRoundRobin(sub, lastOf[sub], func(a netip.Addr) bool { return owned[a] && !used[a] }, func(a netip.Addr) bool { return owned[a] && used[a] })
					if want.IsValid() != (err == nil) || got != want {
						t.Fatalf("seed %d step %d: AllocateAfter(%v, %v) = %v, %v; model %v", seed, step, sub, lastOf[sub], got, err, want)
					}
					if err == nil {
						used[got] = true
						lastOf[sub] = got
					}
				case 1:
					a := netip.AddrFrom4([4]byte{10, 0, byte(1 + rng.IntN(2)), byte(rng.IntN(256))})
					err := s.Claim(a)
					if ok := owned[a] && !used[a]; ok != (err == nil) {
						t.Fatalf("seed %d step %d: Claim(%v) = %v; model owned %v used %v", seed, step, a, err, owned[a], used[a])
					}
					if err == nil {
						used[a] = true
					}
				case 2:
					a := netip.AddrFrom4([4]byte{10, 0, byte(1 + rng.IntN(2)), byte(rng.IntN(256))})
					err := s.Release(a)
					if ok := used[a]; ok != (err == nil) {
						t.Fatalf("seed %d step %d: Release(%v) = %v; model used %v", seed, step, a, err, used[a])
					}
					delete(used, a)
				}
				if want := U128(uint64(len(owned) - len(used))); s.FreeCount() != want {
					t.Fatalf("seed %d step %d: free %v, model %v", seed, step, s.FreeCount(), want)
				}
			}
		})
	}
}

func TestSpaceFreeBlock(t *testing.T) {
	tests := []struct {
		name    string
		owned   []string
		claimed []string
		within  []string
		log2    int
		want    string // "" for nothing
	}{
		{"all free: the top block", []string{"10.0.1.0/24"}, nil, []string{"10.0.1.0/24"}, 5, "10.0.1.224/27"},
		{"a claimed top: the next block down", []string{"10.0.1.0/24"}, []string{"10.0.1.255"}, []string{"10.0.1.0/24"}, 5, "10.0.1.192/27"},
		{"never a claimed (gateway) address", []string{"10.0.1.0/30"}, []string{"10.0.1.1"}, []string{"10.0.1.0/24"}, 1, "10.0.1.2/31"},
		{"outside within: none", []string{"10.0.1.0/24"}, nil, []string{"10.0.2.0/24"}, 5, ""},
		{"within narrows", []string{"10.0.1.0/24"}, nil, []string{"10.0.1.0/25"}, 5, "10.0.1.96/27"},
		{"too large", []string{"10.0.1.0/28"}, nil, []string{"10.0.1.0/24"}, 5, ""},
		{"never across ranges", []string{"10.0.1.0/25", "10.0.1.128/25"}, []string{"10.0.1.0", "10.0.1.255"},
			[]string{"10.0.1.0/24"}, 7, ""},
		{"nothing owned", nil, nil, []string{"10.0.1.0/24"}, 2, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := testSpace(t, "10.0.0.0/16", tt.owned...)
			for _, c := range tt.claimed {
				if err := s.Claim(ip(t, c)); err != nil {
					t.Fatal(err)
				}
			}
			var within []netip.Prefix
			for _, w := range tt.within {
				within = append(within, pfx(t, w))
			}
			got, ok := s.FreeBlock(within, tt.log2)
			if tt.want == "" {
				if ok {
					t.Fatalf("FreeBlock = %v, want none", got)
				}
				return
			}
			if !ok || got != pfx(t, tt.want) {
				t.Fatalf("FreeBlock = %v, %v; want %s", got, ok, tt.want)
			}
		})
	}
}

func TestSpaceSetOwned(t *testing.T) {
	s := testSpace(t, "10.0.0.0/16", "10.0.1.0/24")
	for _, c := range []string{"10.0.1.2", "10.0.1.200"} {
		if err := s.Claim(ip(t, c)); err != nil {
			t.Fatal(err)
		}
	}
	// Splitting the range and adding one keeps what is in use.
	split := []Range{
		{ip(t, "10.0.1.0"), ip(t, "10.0.1.127")},
		{ip(t, "10.0.1.128"), ip(t, "10.0.1.255")},
		{ip(t, "10.0.5.0"), ip(t, "10.0.5.255")},
	}
	if err := s.SetOwned(split); err != nil {
		t.Fatal(err)
	}
	if s.FreeCount() != U128(510) || s.IsFree(ip(t, "10.0.1.2")) || !s.IsFree(ip(t, "10.0.5.9")) {
		t.Fatalf("after split: free %v", s.FreeCount())
	}
	// Dropping a range with an address in use is refused, unchanged.
	var te *TakeoverError
	if err := s.SetOwned(split[:1]); !errors.As(err, &te) {
		t.Fatalf("SetOwned dropping an address in use = %v, want *TakeoverError", err)
	}
	if len(s.Owned()) != 3 || s.FreeCount() != U128(510) {
		t.Fatalf("refused SetOwned changed the space")
	}
	// Dropping an unused range works.
	if err := s.SetOwned(split[:2]); err != nil {
		t.Fatal(err)
	}
	if s.FreeCount() != U128(254) {
		t.Fatalf("free = %v, want 254", s.FreeCount())
	}
	tests := []struct {
		name   string
		ranges []Range
	}{
		{"unsorted", []Range{split[1], split[0]}},
		{"overlapping", []Range{split[0], {ip(t, "10.0.1.100"), ip(t, "10.0.1.255")}}},
		{"reversed", []Range{{ip(t, "10.0.1.9"), ip(t, "10.0.1.1")}}},
		{"outside", []Range{{ip(t, "10.1.0.0"), ip(t, "10.1.0.9")}}},
	}
	for _, tt := range tests {
		if err := s.SetOwned(tt.ranges); err == nil {
			t.Errorf("SetOwned(%s) accepted", tt.name)
		}
	}
}

func TestSpaceIPv6Counts(t *testing.T) {
	s := testSpace(t, "fd00::/48", "fd00:0:0:1::/64")
	if want := (Uint128{Hi: 1}); s.FreeCount() != want {
		t.Fatalf("free in a /64 = %v, want 2^64", s.FreeCount())
	}
	a, err := s.AllocateAfter(pfx(t, "fd00:0:0:1::/64"), netip.Addr{})
	if err != nil || a != ip(t, "fd00:0:0:1::2") {
		t.Fatalf("Allocate = %v, %v", a, err)
	}
	if want := (Uint128{Lo: ^uint64(0)}); s.FreeCount() != want {
		t.Fatalf("free = %v, want 2^64-1", s.FreeCount())
	}
	p, ok := s.FreeBlock([]netip.Prefix{pfx(t, "fd00:0:0:1::/64")}, 62)
	if !ok || p != pfx(t, "fd00:0:0:1:c000::/66") {
		t.Fatalf("FreeBlock = %v, %v", p, ok)
	}
}

// modelRoundRobin is AllocateAfter written plainly: the hosts of sub in
// order from the one after last (after the highest in use when last is not
// one of them), wrapping, and the first free one.
func modelRoundRobin(sub netip.Prefix, last netip.Addr, free, inUse func(netip.Addr) bool) netip.Addr {
	var hosts []netip.Addr
	for a, end := sub.Addr().Next().Next(), lastAddr(sub).Prev(); a.Compare(end) <= 0; a = a.Next() {
		hosts = append(hosts, a)
	}
	start := 0
	if i := slices.Index(hosts, last); i >= 0 {
		start = i + 1
	} else {
		for i, a := range hosts {
			if inUse(a) {
				start = i + 1
			}
		}
	}
	for k := range hosts {
		if a := hosts[(start+k)%len(hosts)]; free(a) {
			return a
		}
	}
	return netip.Addr{}
}
