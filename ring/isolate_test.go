package ring

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
)

// TestSeedSetsIsolating: the masters' records that take a range holding
// allocations are taken, not refused; exactly the allocations there are
// isolated (kept bound, out of the space, never handed out again here),
// the rest of the peer's space keeps serving, and releasing an isolated
// attachment works. SeedSets refuses the same records whole.
func TestSeedSetsIsolating(t *testing.T) {
	u := netip.MustParsePrefix("10.0.0.0/24")
	a, err := NewAllocator("a", u)
	if err != nil {
		t.Fatal(err)
	}
	lease := LeaseSet{Owner: "a", Version: 1, Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/26"), netip.MustParsePrefix("10.0.0.64/26")}}
	if _, err := a.SeedSets([]LeaseSet{lease}, nil); err != nil {
		t.Fatal(err)
	}
	kept, lost := Attachment{"kept", "eth0"}, Attachment{"lost", "eth0"}
	if err := a.Claim(kept, netip.MustParseAddr("10.0.0.10")); err != nil {
		t.Fatal(err)
	}
	if err := a.Claim(lost, netip.MustParseAddr("10.0.0.70")); err != nil {
		t.Fatal(err)
	}
	if err := a.Reserve(netip.MustParseAddr("10.0.0.65")); err != nil {
		t.Fatal(err)
	}
	// The masters now lease the second /26 to b.
	taken := []LeaseSet{{Owner: "a", Version: 5, Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/26")}},
		{Owner: "b", Version: 6, Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.64/26")}}}
	refusing := a.clone(t)
	var te *TakeoverError
	if _, err := refusing.SeedSets(taken, nil); !errors.As(err, &te) {
		t.Fatalf("SeedSets: %v, want a TakeoverError", err)
	}
	changed, isolated, err := a.SeedSetsIsolating(taken, nil)
	if err != nil || !changed {
		t.Fatalf("SeedSetsIsolating: changed %t, %v", changed, err)
	}
	if len(isolated) != 1 || isolated[0].Attachment != lost || isolated[0].Addr != netip.MustParseAddr("10.0.0.70") {
		t.Fatalf("isolated %v, want lost at 10.0.0.70", isolated)
	}
	if owner, _ := a.Ring().Owner(netip.MustParseAddr("10.0.0.70")); owner != "b" {
		t.Errorf("10.0.0.70's owner is %q, want b (the masters' word)", owner)
	}
	if got := a.Isolated(); len(got) != 1 || got[0].Attachment != lost {
		t.Errorf("Isolated() = %v", got)
	}
	if addr, _ := a.Allocate(lost, netip.MustParsePrefix("10.0.0.0/26")); addr != netip.MustParseAddr("10.0.0.70") {
		t.Errorf("the isolated attachment's address is %v, want it kept", addr)
	}
	// The rest serves: every new allocation lands in the range kept.
	for i := range 20 {
		addr, err := a.Allocate(Attachment{string(rune('A' + i)), "eth0"}, netip.MustParsePrefix("10.0.0.0/26"))
		if err != nil || !netip.MustParsePrefix("10.0.0.0/26").Contains(addr) {
			t.Fatalf("allocation %d: %v %v", i, addr, err)
		}
	}
	if _, ok := a.Release(lost); !ok {
		t.Error("releasing the isolated attachment failed")
	}
	if len(a.Isolated()) != 0 {
		t.Error("a released attachment stays isolated")
	}
	if _, ok := a.Holder(netip.MustParseAddr("10.0.0.70")); ok {
		t.Error("the released isolated address still has a holder")
	}
}

// clone copies an allocator through its ring and claims (for comparing two
// ways of applying the same records).
func (a *Allocator) clone(t *testing.T) *Allocator {
	t.Helper()
	c, err := NewAllocator(a.self, a.ring.u.prefix)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Merge(a.Ring()); err != nil {
		t.Fatal(err)
	}
	for at, addr := range a.byAttach {
		if err := c.Claim(at, addr); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// TestIsolatedAddressRegained: the masters' records take a range holding
// an allocation (isolated), then give it back to the peer (a restore, or a
// grant recorded again). The isolated address is in use again in the
// space: no allocation of the subnet gets it while its attachment holds
// it (the container still uses it), and releasing the attachment frees it.
// Before, the regained range came back wholly free, and the next
// allocations handed the address out a second time on the same peer.
func TestIsolatedAddressRegained(t *testing.T) {
	u := netip.MustParsePrefix("10.0.0.0/24")
	block := netip.MustParsePrefix("10.0.0.64/28")
	held := netip.MustParseAddr("10.0.0.70")
	tests := []struct {
		name string
		back []LeaseSet // the records that give the range back
	}{
		{"the records give it back", []LeaseSet{{Owner: "a", Version: 9, Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/26"), block}},
			{Owner: "b", Version: 9}}},
		{"a newer record of its holder leaves it out", []LeaseSet{{Owner: "a", Version: 9, Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/26"), block}},
			{Owner: "b", Version: 10}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := NewAllocator("a", u)
			if err != nil {
				t.Fatal(err)
			}
			first := LeaseSet{Owner: "a", Version: 1, Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/26"), block}}
			if _, err := a.SeedSets([]LeaseSet{first}, nil); err != nil {
				t.Fatal(err)
			}
			lost := Attachment{"lost", "eth0"}
			if err := a.Claim(lost, held); err != nil {
				t.Fatal(err)
			}
			taken := []LeaseSet{{Owner: "a", Version: 5, Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/26")}},
				{Owner: "b", Version: 6, Prefixes: []netip.Prefix{block}}}
			if _, isolated, err := a.SeedSetsIsolating(taken, nil); err != nil || len(isolated) != 1 {
				t.Fatalf("SeedSetsIsolating: isolated %v, %v", isolated, err)
			}
			if _, isolated, err := a.SeedSetsIsolating(tt.back, nil); err != nil || len(isolated) != 0 {
				t.Fatalf("the range given back: isolated %v, %v", isolated, err)
			}
			if owner, _ := a.Ring().Owner(held); owner != "a" {
				t.Fatalf("%s's owner is %q, want a again", held, owner)
			}
			for i := range 12 { // the /28's 13 addresses to hand out (no gateway), one held
				addr, err := a.Allocate(Attachment{fmt.Sprintf("new-%d", i), "eth0"}, block)
				if err != nil {
					t.Fatalf("allocation %d in %s: %v", i, block, err)
				}
				if addr == held {
					t.Fatalf("allocation %d got %s, which %v still holds", i, held, lost)
				}
			}
			if addr, err := a.Allocate(Attachment{"one-too-many", "eth0"}, block); err == nil {
				t.Errorf("a 14th allocation in %s got %s", block, addr)
			}
			if addr, ok := a.Release(lost); !ok || addr != held {
				t.Fatalf("release of %v: %s %t", lost, addr, ok)
			}
			if addr, err := a.Allocate(Attachment{"after", "eth0"}, block); err != nil || addr != held {
				t.Errorf("after its release, %s: got %s %v, want it handed out", held, addr, err)
			}
		})
	}
}
