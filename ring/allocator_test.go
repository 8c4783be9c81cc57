package ring

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"testing"
)

func seededAllocator(t testing.TB, self string) *Allocator {
	t.Helper()
	a := mustAllocator(t, self, "10.0.0.0/16")
	leases := []Lease{{"a", pfx(t, "10.0.1.0/24"), 5}, {"b", pfx(t, "10.0.2.0/24"), 6}}
	if _, err := a.Seed(leases, nil); err != nil {
		t.Fatal(err)
	}
	checkInvariant(t, a)
	return a
}

func TestAllocatorIdempotent(t *testing.T) {
	a := seededAllocator(t, "a")
	bridge := pfx(t, "10.0.1.0/25")
	c1 := Attachment{"c1", "eth0"}
	first, err := a.Allocate(c1, bridge)
	if err != nil || first != ip(t, "10.0.1.2") {
		t.Fatalf("Allocate = %v, %v", first, err)
	}
	again, err := a.Allocate(c1, bridge)
	if err != nil || again != first {
		t.Fatalf("second Allocate = %v, %v; want %v", again, err, first)
	}
	second, _ := a.Allocate(Attachment{"c1", "eth1"}, bridge)
	if second != ip(t, "10.0.1.3") {
		t.Fatalf("other interface got %v", second)
	}
	if got, ok := a.Lookup(c1); !ok || got != first {
		t.Fatalf("Lookup = %v, %v", got, ok)
	}
	if at, ok := a.Holder(second); !ok || at != (Attachment{"c1", "eth1"}) {
		t.Fatalf("Holder = %v, %v", at, ok)
	}
	if _, err := a.Allocate(Attachment{"c2", "eth0"}, pfx(t, "10.0.2.0/25")); !errors.Is(err, ErrFull) {
		t.Fatalf("Allocate in a range of another peer = %v, want ErrFull", err)
	}
	checkInvariant(t, a)
}

func TestAllocatorClaim(t *testing.T) {
	a := seededAllocator(t, "a")
	c1, c2 := Attachment{"c1", "eth0"}, Attachment{"c2", "eth0"}
	tests := []struct {
		name string
		at   Attachment
		addr string
		want error
	}{
		{"claim", c1, "10.0.1.78", nil},
		{"same claim again", c1, "10.0.1.78", nil},
		{"attachment holds another", c1, "10.0.1.79", ErrAttachmentBound},
		{"address held by another", c2, "10.0.1.78", ErrAddressInUse},
		{"address of another peer", c2, "10.0.2.7", ErrNotOwned},
		{"outside", c2, "10.9.0.1", ErrOutside},
	}
	for _, tt := range tests {
		if err := a.Claim(tt.at, ip(t, tt.addr)); !errors.Is(err, tt.want) {
			t.Fatalf("%s: Claim = %v, want %v", tt.name, err, tt.want)
		}
	}
	// A claimed address is skipped by allocation.
	got, _ := a.Allocate(c2, pfx(t, "10.0.1.76/30"))
	if got.IsValid() {
		t.Fatalf("Allocate in a /30 whose only host is claimed = %v", got)
	}
	checkInvariant(t, a)
}

func TestAllocatorRelease(t *testing.T) {
	a := seededAllocator(t, "a")
	bridge := pfx(t, "10.0.1.0/24")
	ats := []Attachment{{"c1", "eth0"}, {"c1", "eth1"}, {"c2", "eth0"}, {"c3", "eth0"}, {"c3", "eth1"}}
	for _, at := range ats {
		if _, err := a.Allocate(at, bridge); err != nil {
			t.Fatal(err)
		}
	}
	if addr, ok := a.Release(ats[2]); !ok || addr != ip(t, "10.0.1.4") {
		t.Fatalf("Release = %v, %v", addr, ok)
	}
	if _, ok := a.Release(ats[2]); ok {
		t.Fatal("second Release reported an address")
	}
	got := a.ReleaseContainer("c1")
	want := []Allocation{{ats[0], ip(t, "10.0.1.2")}, {ats[1], ip(t, "10.0.1.3")}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ReleaseContainer = %v, want %v", got, want)
	}
	if got := a.ReleaseContainer("c1"); len(got) != 0 {
		t.Fatalf("second ReleaseContainer = %v", got)
	}
	// The freed addresses are not handed out at once: allocation goes on
	// after the last one handed out (round-robin).
	if addr, _ := a.Allocate(Attachment{"c4", "eth0"}, bridge); addr != ip(t, "10.0.1.7") {
		t.Fatalf("Allocate after release = %v", addr)
	}
	checkInvariant(t, a)
}

func TestAllocatorGC(t *testing.T) {
	tests := []struct {
		name string
		keep []Attachment
		want []string // containers left, by attachment string
	}{
		{"keep nothing", nil, nil},
		{"keep exact", []Attachment{{"c1", "eth0"}}, []string{"c1/eth0"}},
		{"keep whole container", []Attachment{{"c3", ""}}, []string{"c3/eth0", "c3/eth1"}},
		{"keep unknown", []Attachment{{"zz", "eth0"}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := seededAllocator(t, "a")
			for _, at := range []Attachment{{"c1", "eth0"}, {"c1", "eth1"}, {"c2", "eth0"}, {"c3", "eth0"}, {"c3", "eth1"}} {
				if _, err := a.Allocate(at, pfx(t, "10.0.1.0/24")); err != nil {
					t.Fatal(err)
				}
			}
			a.GC(tt.keep)
			var left []string
			for _, al := range a.Allocations() {
				left = append(left, al.ContainerID+"/"+al.Interface)
			}
			if !reflect.DeepEqual(left, tt.want) {
				t.Fatalf("left %v, want %v", left, tt.want)
			}
			checkInvariant(t, a)
		})
	}
}

func TestAllocatorReserve(t *testing.T) {
	a := seededAllocator(t, "a")
	gw := ip(t, "10.0.1.1")
	if err := a.Reserve(gw); err != nil {
		t.Fatal(err)
	}
	if err := a.Reserve(gw); err != nil {
		t.Fatalf("second Reserve = %v", err)
	}
	if err := a.Claim(Attachment{"c", "eth0"}, gw); !errors.Is(err, ErrAddressInUse) {
		t.Fatalf("Claim of a reserved address = %v", err)
	}
	if a.FreeCount() != U128(255) {
		t.Fatalf("free = %v", a.FreeCount())
	}
	a.Unreserve(gw)
	if a.FreeCount() != U128(256) || len(a.Reserved()) != 0 {
		t.Fatalf("after Unreserve free = %v reserved %v", a.FreeCount(), a.Reserved())
	}
}

func TestAllocatorStateRoundTrip(t *testing.T) {
	a := seededAllocator(t, "a")
	for _, at := range []Attachment{{"c1", "eth0"}, {"c2", "eth0"}} {
		if _, err := a.Allocate(at, pfx(t, "10.0.1.0/25")); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Reserve(ip(t, "10.0.1.129")); err != nil {
		t.Fatal(err)
	}
	if err := a.Grant("b", pfx(t, "10.0.1.192/26")); err != nil {
		t.Fatal(err)
	}
	st := a.State()
	b, err := RestoreAllocator(st)
	if err != nil {
		t.Fatalf("RestoreAllocator: %v", err)
	}
	if !reflect.DeepEqual(b.State(), st) {
		t.Fatalf("restored state differs:\n%+v\n%+v", b.State(), st)
	}
	if a.FreeCount() != b.FreeCount() || !reflect.DeepEqual(a.Owned(), b.Owned()) {
		t.Fatalf("restored space differs")
	}
	checkInvariant(t, b)
	// The restored allocator goes on where the first left off.
	x, _ := a.Allocate(Attachment{"c9", "eth0"}, pfx(t, "10.0.1.0/25"))
	y, _ := b.Allocate(Attachment{"c9", "eth0"}, pfx(t, "10.0.1.0/25"))
	if x != y {
		t.Fatalf("next allocation differs: %v vs %v", x, y)
	}

	bad := []struct {
		name   string
		mutate func(*State)
	}{
		{"corrupt ring", func(s *State) { s.Ring = s.Ring[:len(s.Ring)-1] }},
		{"address not owned", func(s *State) { s.Allocations[0].Addr = ip(t, "10.0.2.9") }},
		{"address twice", func(s *State) { s.Allocations[1].Addr = s.Allocations[0].Addr }},
		{"reserved twice", func(s *State) { s.Reserved = append(s.Reserved, s.Reserved[0]) }},
		{"no self", func(s *State) { s.Self = "" }},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			s := a.State()
			tt.mutate(&s)
			if _, err := RestoreAllocator(s); err == nil {
				t.Fatal("RestoreAllocator accepted a bad state")
			}
		})
	}
}

// TestAllocatorMergeGuard checks that a remote change taking a range where
// this peer has allocations is refused with a *TakeoverError and changes
// nothing, while the same change without allocations goes through.
func TestAllocatorMergeGuard(t *testing.T) {
	tests := []struct {
		name     string
		allocate string // address allocated by "a" before the merge, "" for none
		wantErr  bool
	}{
		{"range in use", "10.0.1.200", true},
		{"range not in use", "10.0.1.2", false},
		{"nothing allocated", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := seededAllocator(t, "a")
			if tt.allocate != "" {
				if err := a.Claim(Attachment{"c", "eth0"}, ip(t, tt.allocate)); err != nil {
					t.Fatal(err)
				}
			}
			// A remote peer that holds a grant of the top half a wrote
			// and lost (its data dir): a's own word, so it counts.
			remote := a.Ring()
			remote.st = remote.derive(upsert(remote.u, remote.st.raw,
				rawToken{start: U128(256 + 128), owner: "x", version: 5<<32 | 7, free: U128(128), signer: "a"}),
				remote.st.leases, remote.st.sets, remote.st.tombs)
			before := a.State()
			changed, err := a.Merge(remote)
			var te *TakeoverError
			if tt.wantErr {
				if !errors.As(err, &te) || changed {
					t.Fatalf("Merge = %v, %v; want *TakeoverError", changed, err)
				}
				if te.Peer != "a" || te.NewOwner != "x" || !te.Range.Contains(ip(t, tt.allocate)) {
					t.Fatalf("TakeoverError = %+v", te)
				}
				if !reflect.DeepEqual(a.State(), before) {
					t.Fatal("refused merge changed the allocator")
				}
			} else {
				if err != nil || !changed {
					t.Fatalf("Merge = %v, %v; want accepted", changed, err)
				}
				if o, _ := a.ring.Owner(ip(t, "10.0.1.200")); o != "x" {
					t.Fatalf("owner after merge = %q", o)
				}
			}
			checkInvariant(t, a)
		})
	}
}

func TestAllocatorSeedGuard(t *testing.T) {
	a := seededAllocator(t, "a")
	if _, err := a.Allocate(Attachment{"c", "eth0"}, pfx(t, "10.0.1.0/24")); err != nil {
		t.Fatal(err)
	}
	var te *TakeoverError
	if _, err := a.Seed(nil, []Tombstone{{"a", 9}}); !errors.As(err, &te) {
		t.Fatalf("tombstone of self with allocations = %v, want *TakeoverError", err)
	}
	a.GC(nil)
	if changed, err := a.Seed(nil, []Tombstone{{"a", 9}}); err != nil || !changed {
		t.Fatalf("tombstone of self without allocations = %v, %v", changed, err)
	}
	if len(a.Owned()) != 0 {
		t.Fatalf("owned after tombstone = %v", a.Owned())
	}
	checkInvariant(t, a)
}

func TestAllocatorDonate(t *testing.T) {
	a := seededAllocator(t, "a")
	b := seededAllocator(t, "b")
	for i := range 10 {
		if _, err := a.Allocate(Attachment{fmt.Sprint("c", i), "eth0"}, pfx(t, "10.0.1.0/24")); err != nil {
			t.Fatal(err)
		}
	}
	// The highest free /26 of the /24 goes.
	p, err := a.DonateBlock("b", []netip.Prefix{pfx(t, "10.0.1.0/24")}, 6)
	if err != nil || p != pfx(t, "10.0.1.192/26") {
		t.Fatalf("Donate = %v, %v", p, err)
	}
	checkInvariant(t, a)
	if _, err := b.Merge(a.Ring()); err != nil {
		t.Fatal(err)
	}
	checkInvariant(t, b)
	if got := b.Owned(); len(got) != 2 || got[0].Prefixes()[0] != p {
		t.Fatalf("b owns %v after the grant", got)
	}
	if err := a.Grant("b", pfx(t, "10.0.1.0/29")); !errors.Is(err, ErrAddressInUse) {
		t.Fatalf("Grant of a block in use = %v", err)
	}
	// A peer with nothing free has nothing to donate.
	c := mustAllocator(t, "c", "10.0.0.0/16")
	if _, err := c.DonateBlock("a", []netip.Prefix{pfx(t, "10.0.0.0/16")}, 2); !errors.Is(err, ErrNothingToDonate) {
		t.Fatalf("Donate from an empty peer = %v", err)
	}
}

func TestAllocatorSyncFree(t *testing.T) {
	a := seededAllocator(t, "a")
	if _, err := a.Allocate(Attachment{"c", "eth0"}, pfx(t, "10.0.1.0/24")); err != nil {
		t.Fatal(err)
	}
	changed, err := a.SyncFree()
	if err != nil || !changed {
		t.Fatalf("SyncFree = %v, %v", changed, err)
	}
	if got := a.ring.freeByPeer()["a"]; got != U128(255) {
		t.Fatalf("ring free of a = %v, want 255", got)
	}
	if changed, _ := a.SyncFree(); changed {
		t.Fatal("second SyncFree changed the ring")
	}
}
