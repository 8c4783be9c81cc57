package ring

import (
	"errors"
	"net/netip"
	"testing"
)

func TestSeed(t *testing.T) {
	const u = "10.128.0.0/9"
	type probe struct{ addr, owner string }
	tests := []struct {
		name   string
		seeds  [][]Lease // applied in order
		tombs  []Tombstone
		probes []probe
	}{
		{
			name:  "one lease",
			seeds: [][]Lease{{{"a", pfx(t, "10.128.1.0/24"), 5}}},
			probes: []probe{
				{"10.128.0.255", ""}, {"10.128.1.0", "a"}, {"10.128.1.255", "a"}, {"10.128.2.0", ""}, {"10.255.255.255", ""},
			},
		},
		{
			name:   "adjacent leases",
			seeds:  [][]Lease{{{"a", pfx(t, "10.128.1.0/24"), 5}, {"b", pfx(t, "10.128.2.0/24"), 6}}},
			probes: []probe{{"10.128.1.255", "a"}, {"10.128.2.0", "b"}, {"10.128.3.0", ""}},
		},
		{
			name:   "lease at the end of the universe",
			seeds:  [][]Lease{{{"z", pfx(t, "10.255.255.0/24"), 5}}},
			probes: []probe{{"10.255.255.255", "z"}, {"10.128.0.0", ""}},
		},
		{
			name:   "newer lease of the same prefix dominates",
			seeds:  [][]Lease{{{"a", pfx(t, "10.128.1.0/24"), 5}}, {{"b", pfx(t, "10.128.1.0/24"), 3}}, {{"c", pfx(t, "10.128.1.0/24"), 9}}},
			tombs:  []Tombstone{{"a", 7}},
			probes: []probe{{"10.128.1.7", "c"}},
		},
		{
			name:   "tombstone frees the range",
			seeds:  [][]Lease{{{"a", pfx(t, "10.128.1.0/24"), 5}}},
			tombs:  []Tombstone{{"a", 8}},
			probes: []probe{{"10.128.1.7", ""}},
		},
		{
			name:   "older tombstone does not void a newer lease",
			seeds:  [][]Lease{{{"a", pfx(t, "10.128.1.0/24"), 9}}},
			tombs:  []Tombstone{{"a", 8}},
			probes: []probe{{"10.128.1.7", "a"}},
		},
		{
			name:   "released range leased again",
			seeds:  [][]Lease{{{"a", pfx(t, "10.128.1.0/24"), 5}}, {{"b", pfx(t, "10.128.1.0/24"), 12}}},
			tombs:  []Tombstone{{"a", 8}},
			probes: []probe{{"10.128.1.7", "b"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRing(t, u)
			for _, s := range tt.seeds {
				mustSeed(t, r, s, nil)
			}
			mustSeed(t, r, nil, tt.tombs)
			for _, p := range tt.probes {
				if got := ownerOf(t, r, p.addr); got != p.owner {
					t.Errorf("owner(%s) = %q, want %q\n%v", p.addr, got, p.owner, r)
				}
			}
			checkValid(t, r)
			// Another peer given everything at once, in reverse order,
			// derives the same ring.
			o := newRing(t, u)
			var all []Lease
			for i := len(tt.seeds) - 1; i >= 0; i-- {
				all = append(all, tt.seeds[i]...)
			}
			mustSeed(t, o, all, tt.tombs)
			if !o.Equal(r) {
				t.Fatalf("seeding in another order differs:\n%v\n%v", r, o)
			}
		})
	}
}

// TestLeaseKeepsGrantee: a range the previous lessee granted to a live peer
// stays with that peer when the subnet is leased again once the masters
// recorded the grant (their quarantine of a deleted agent's space waits
// for every grant to be reported); the rest, emptied by the tombstone,
// goes to the new lessee. A grant they never recorded counts no more once
// its donor leases the space no more: its token is the donor's word only.
func TestLeaseKeepsGrantee(t *testing.T) {
	for _, tt := range []struct {
		name     string
		recorded bool
		want     map[string]string
	}{
		{"recorded", true, map[string]string{"10.0.1.0": "c", "10.0.1.64": "b", "10.0.1.127": "b", "10.0.1.128": "c", "10.0.1.255": "c"}},
		{"never recorded", false, map[string]string{"10.0.1.0": "c", "10.0.1.64": "c", "10.0.1.127": "c", "10.0.1.128": "c", "10.0.1.255": "c"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRing(t, "10.0.0.0/16")
			mustSeed(t, r, []Lease{{"a", pfx(t, "10.0.1.0/24"), 5}}, nil)
			if err := r.Grant("a", "b", pfx(t, "10.0.1.64/26")); err != nil {
				t.Fatal(err)
			}
			if got := ownerOf(t, r, "10.0.1.64"); got != "b" {
				t.Fatalf("owner(10.0.1.64) after the grant = %q, want b\n%v", got, r)
			}
			if tt.recorded {
				// The masters recorded the grant, then leased the rest
				// of a's space to c.
				mustSeed(t, r, []Lease{{"b", pfx(t, "10.0.1.64/26"), 10}}, nil)
				mustSeed(t, r, []Lease{{"c", pfx(t, "10.0.1.0/26"), 12}, {"c", pfx(t, "10.0.1.128/25"), 12}}, []Tombstone{{"a", 8}})
			} else {
				mustSeed(t, r, []Lease{{"c", pfx(t, "10.0.1.0/24"), 12}}, []Tombstone{{"a", 8}})
			}
			for addr, want := range tt.want {
				if got := ownerOf(t, r, addr); got != want {
					t.Errorf("owner(%s) = %q, want %q\n%v", addr, got, want, r)
				}
			}
		})
	}
}

func TestSeedVersions(t *testing.T) {
	r := newRing(t, "10.0.0.0/16")
	mustSeed(t, r, []Lease{{"a", pfx(t, "10.0.1.0/24"), 5}}, nil)
	toks := r.Tokens()
	if toks[1].Version != 5<<32 || toks[1].Free != U128(256) {
		t.Fatalf("lease token = %+v, want version 5<<32 and 256 free", toks[1])
	}
	mustSeed(t, r, nil, []Tombstone{{"a", 9}})
	toks = r.Tokens()
	if toks[1].Owner != "" || toks[1].Version != 9<<32 || !toks[1].Free.IsZero() {
		t.Fatalf("tombstoned token = %+v, want no owner at version 9<<32", toks[1])
	}
	if changed, err := r.Seed([]Lease{{"a", pfx(t, "10.0.1.0/24"), 5}}, nil); err != nil || changed {
		t.Fatalf("seeding an old table again = %v, %v; want no change", changed, err)
	}
}

func TestSeedErrors(t *testing.T) {
	tests := []struct {
		name  string
		lease Lease
		tomb  Tombstone
		want  error
	}{
		{"no owner", Lease{"", pfx(t, "10.0.1.0/24"), 1}, Tombstone{}, ErrInvalid},
		{"version 0", Lease{"a", pfx(t, "10.0.1.0/24"), 0}, Tombstone{}, ErrInvalid},
		{"version too big", Lease{"a", pfx(t, "10.0.1.0/24"), 1 << 32}, Tombstone{}, ErrInvalid},
		{"outside", Lease{"a", pfx(t, "10.1.1.0/24"), 1}, Tombstone{}, ErrOutside},
		{"larger than universe", Lease{"a", pfx(t, "10.0.0.0/15"), 1}, Tombstone{}, ErrOutside},
		{"other family", Lease{"a", pfx(t, "fd00::/120"), 1}, Tombstone{}, ErrOutside},
		{"host bits", Lease{"a", pfx(t, "10.0.1.1/24"), 1}, Tombstone{}, ErrNotAligned},
		{"tombstone without owner", Lease{"a", pfx(t, "10.0.9.0/24"), 1}, Tombstone{"", 3}, ErrInvalid},
		{"tombstone version 0", Lease{"a", pfx(t, "10.0.9.0/24"), 1}, Tombstone{"x", 0}, ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRing(t, "10.0.0.0/16")
			mustSeed(t, r, []Lease{{"a", pfx(t, "10.0.1.0/24"), 5}}, nil)
			before := r.Encode()
			var tombs []Tombstone
			if tt.tomb != (Tombstone{}) {
				tombs = []Tombstone{tt.tomb}
			}
			_, err := r.Seed([]Lease{tt.lease}, tombs)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Seed = %v, want %v", err, tt.want)
			}
			if string(r.Encode()) != string(before) {
				t.Fatalf("failed seed changed the ring")
			}
		})
	}
}

// TestOverlappingLeases checks how leases of two agents that overlap (a
// donor's block, and a grant inside it the masters recorded later) and
// complete lease sets resolve: the higher index wins where they overlap, a
// newer set replaces its agent's older leases, and a block given back to
// nobody is filled by a later lease of another agent.
func TestOverlappingLeases(t *testing.T) {
	set := func(owner string, v uint64, ps ...string) LeaseSet {
		s := LeaseSet{Owner: owner, Version: v}
		for _, p := range ps {
			s.Prefixes = append(s.Prefixes, pfx(t, p))
		}
		return s
	}
	type probe struct{ addr, owner string }
	tests := []struct {
		name   string
		steps  [][]LeaseSet
		probes []probe
	}{
		{"grant recorded later wins inside the donor's older block",
			[][]LeaseSet{{set("d", 5, "10.0.1.0/25", "10.0.1.128/25")}, {set("r", 9, "10.0.2.0/24", "10.0.1.96/27")}},
			[]probe{{"10.0.1.95", "d"}, {"10.0.1.96", "r"}, {"10.0.1.127", "r"}, {"10.0.1.128", "d"}}},
		{"same, seeded in the other order",
			[][]LeaseSet{{set("r", 9, "10.0.2.0/24", "10.0.1.96/27")}, {set("d", 5, "10.0.1.0/25", "10.0.1.128/25")}},
			[]probe{{"10.0.1.95", "d"}, {"10.0.1.96", "r"}, {"10.0.1.128", "d"}}},
		{"the donor's newer set drops the granted part",
			[][]LeaseSet{{set("d", 5, "10.0.1.0/25")}, {set("d", 9, "10.0.1.0/26", "10.0.1.64/27")}},
			[]probe{{"10.0.1.64", "d"}, {"10.0.1.96", ""}}},
		{"an older set changes nothing",
			[][]LeaseSet{{set("d", 9, "10.0.1.0/26")}, {set("d", 5, "10.0.1.0/25")}},
			[]probe{{"10.0.1.63", "d"}, {"10.0.1.64", ""}}},
		{"a block returned and leased again",
			[][]LeaseSet{{set("a", 10, "10.0.1.0/24", "10.0.3.0/26")}, {set("b", 20, "10.0.3.0/24")}},
			[]probe{{"10.0.3.1", "b"}, {"10.0.3.200", "b"}, {"10.0.1.1", "a"}}},
		{"equal index: the greater owner",
			[][]LeaseSet{{set("x", 7, "10.0.4.0/24")}, {set("y", 7, "10.0.4.0/25")}},
			[]probe{{"10.0.4.1", "y"}, {"10.0.4.128", "x"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRing(t, "10.0.0.0/16")
			for _, st := range tt.steps {
				mustSeedSets(t, r, st)
			}
			for _, p := range tt.probes {
				if got := ownerOf(t, r, p.addr); got != p.owner {
					t.Errorf("owner of %s = %q, want %q\n%v", p.addr, got, p.owner, r)
				}
			}
			// Seeding each step into its own ring and merging gives the same.
			m := newRing(t, "10.0.0.0/16")
			for i := len(tt.steps) - 1; i >= 0; i-- {
				one := newRing(t, "10.0.0.0/16")
				mustSeedSets(t, one, tt.steps[i])
				if _, err := m.Merge(one); err != nil {
					t.Fatal(err)
				}
			}
			if !m.Equal(r) {
				t.Fatalf("merge of the steps differs from seeding them:\n%v\n%v", m, r)
			}
		})
	}
}

// TestReleasedBlockLeasedAgain checks that a grown block given back to nobody
// leaves its agent for good, even with the free counts it wrote there, and
// that a later lease of another agent fills it.
func TestReleasedBlockLeasedAgain(t *testing.T) {
	a := mustAllocator(t, "a", "10.0.0.0/16")
	if _, err := a.SeedSets([]LeaseSet{{"a", 10, []netip.Prefix{pfx(t, "10.0.1.0/24"), pfx(t, "10.0.3.0/26")}}}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := a.SyncFree(); err != nil {
		t.Fatal(err)
	}
	if err := a.ReleaseBlock(pfx(t, "10.0.3.0/26")); err != nil {
		t.Fatal(err)
	}
	if o := ownerOf(t, a.ring, "10.0.3.1"); o != "" {
		t.Fatalf("released block still owned by %q: %v", o, a.ring)
	}
	checkInvariant(t, a)
	// The agent's own older set does not take it back; b's later lease does.
	if _, err := a.SeedSets([]LeaseSet{{"a", 10, []netip.Prefix{pfx(t, "10.0.1.0/24"), pfx(t, "10.0.3.0/26")}}, {"b", 20, []netip.Prefix{pfx(t, "10.0.3.0/24")}}}, nil); err != nil {
		t.Fatal(err)
	}
	if o := ownerOf(t, a.ring, "10.0.3.1"); o != "b" {
		t.Fatalf("owner after b's lease = %q: %v", o, a.ring)
	}
	checkInvariant(t, a)
}
