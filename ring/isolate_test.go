package ring

import (
	"errors"
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
