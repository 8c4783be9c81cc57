package ring

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"
)

func TestNewRing(t *testing.T) {
	tests := []struct {
		universe string
		wantErr  bool
	}{
		{"10.128.0.0/9", false},
		{"0.0.0.0/0", false},
		{"10.0.0.1/32", false},
		{"fd00::/8", false},
		{"fd00::/64", false},
		{"8000::/1", false},
		{"::/0", true},                // 2^128 addresses do not fit
		{"10.128.0.1/9", true},        // host bits
		{"::ffff:10.0.0.0/104", true}, // IPv4-mapped
	}
	for _, tt := range tests {
		t.Run(tt.universe, func(t *testing.T) {
			r, err := NewRing(pfx(t, tt.universe))
			if tt.wantErr {
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("NewRing(%s) = %v, want ErrInvalid", tt.universe, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("NewRing(%s): %v", tt.universe, err)
			}
			toks := r.Tokens()
			if len(toks) != 1 || toks[0].Start != r.Universe().Addr() || toks[0].Owner != "" {
				t.Fatalf("empty ring tokens = %v", toks)
			}
			checkValid(t, r)
		})
	}
}

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
// stays with that peer when the subnet is leased again; the rest, emptied by
// the tombstone, goes to the new lessee.
func TestLeaseKeepsGrantee(t *testing.T) {
	r := newRing(t, "10.0.0.0/16")
	mustSeed(t, r, []Lease{{"a", pfx(t, "10.0.1.0/24"), 5}}, nil)
	if err := r.Grant("a", "b", pfx(t, "10.0.1.64/26")); err != nil {
		t.Fatal(err)
	}
	mustSeed(t, r, []Lease{{"c", pfx(t, "10.0.1.0/24"), 12}}, []Tombstone{{"a", 8}})
	for addr, want := range map[string]string{"10.0.1.0": "c", "10.0.1.64": "b", "10.0.1.127": "b", "10.0.1.128": "c", "10.0.1.255": "c"} {
		if got := ownerOf(t, r, addr); got != want {
			t.Errorf("owner(%s) = %q, want %q\n%v", addr, got, want, r)
		}
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

func TestGrantSplitCases(t *testing.T) {
	type probe struct{ addr, owner string }
	tests := []struct {
		name      string
		universe  string
		lease     string // leased to "a"
		grant     string // from "a" to "b"
		newTokens int
		probes    []probe
	}{
		{"whole range", "10.0.0.0/16", "10.0.1.0/24", "10.0.1.0/24", 0,
			[]probe{{"10.0.0.255", ""}, {"10.0.1.0", "b"}, {"10.0.1.255", "b"}, {"10.0.2.0", ""}}},
		{"start", "10.0.0.0/16", "10.0.1.0/24", "10.0.1.0/26", 1,
			[]probe{{"10.0.1.0", "b"}, {"10.0.1.63", "b"}, {"10.0.1.64", "a"}, {"10.0.1.255", "a"}, {"10.0.2.0", ""}}},
		{"end", "10.0.0.0/16", "10.0.1.0/24", "10.0.1.128/25", 1,
			[]probe{{"10.0.1.0", "a"}, {"10.0.1.127", "a"}, {"10.0.1.128", "b"}, {"10.0.1.255", "b"}, {"10.0.2.0", ""}}},
		{"hole", "10.0.0.0/16", "10.0.1.0/24", "10.0.1.64/27", 2,
			[]probe{{"10.0.1.63", "a"}, {"10.0.1.64", "b"}, {"10.0.1.95", "b"}, {"10.0.1.96", "a"}, {"10.0.1.255", "a"}}},
		{"single address hole", "10.0.0.0/16", "10.0.1.0/24", "10.0.1.7/32", 2,
			[]probe{{"10.0.1.6", "a"}, {"10.0.1.7", "b"}, {"10.0.1.8", "a"}}},
		{"end of universe", "10.0.0.0/16", "10.0.255.0/24", "10.0.255.128/25", 1,
			[]probe{{"10.0.255.127", "a"}, {"10.0.255.255", "b"}, {"10.0.0.0", ""}}},
		{"ipv6 hole in a /64", "fd00::/48", "fd00:0:0:1::/64", "fd00:0:0:1:8000::/66", 2,
			[]probe{{"fd00:0:0:1::", "a"}, {"fd00:0:0:1:7fff:ffff:ffff:ffff", "a"}, {"fd00:0:0:1:8000::", "b"},
				{"fd00:0:0:1:bfff:ffff:ffff:ffff", "b"}, {"fd00:0:0:1:c000::", "a"}, {"fd00:0:0:2::", ""}}},
		{"ipv6 whole /64", "fd00::/48", "fd00:0:0:1::/64", "fd00:0:0:1::/64", 0,
			[]probe{{"fd00:0:0:1::", "b"}, {"fd00:0:0:1:ffff:ffff:ffff:ffff", "b"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRing(t, tt.universe)
			mustSeed(t, r, []Lease{{"a", pfx(t, tt.lease), 5}}, nil)
			before := len(r.Tokens())
			if err := r.Grant("a", "b", pfx(t, tt.grant)); err != nil {
				t.Fatalf("Grant: %v", err)
			}
			if got := len(r.Tokens()) - before; got != tt.newTokens {
				t.Errorf("grant inserted %d tokens, want %d\n%v", got, tt.newTokens, r)
			}
			for _, p := range tt.probes {
				if got := ownerOf(t, r, p.addr); got != p.owner {
					t.Errorf("owner(%s) = %q, want %q\n%v", p.addr, got, p.owner, r)
				}
			}
			// Every token the grant wrote dominates the lease.
			for _, tk := range r.Tokens() {
				if tk.Owner != "" && tk.Version <= 5<<32 {
					t.Errorf("token %+v does not dominate the lease version", tk)
				}
			}
			if got := r.RangesOf("b"); len(got) != 1 || got[0].Prefixes()[0] != pfx(t, tt.grant) {
				t.Errorf("ranges of b = %v, want %s", got, tt.grant)
			}
			checkValid(t, r)
		})
	}
}

func TestGrantErrors(t *testing.T) {
	tests := []struct {
		name     string
		self, to string
		grant    string
		want     error
	}{
		{"not the owner", "b", "c", "10.0.1.0/26", ErrNotOwner},
		{"unowned range", "a", "b", "10.0.7.0/24", ErrNotOwner},
		{"crosses the range end", "a", "b", "10.0.0.0/23", ErrNotOwner},
		{"to self", "a", "a", "10.0.1.0/26", ErrInvalid},
		{"to nobody", "a", "", "10.0.1.0/26", ErrInvalid},
		{"to a departed peer", "a", "gone", "10.0.1.0/26", ErrDeparted},
		{"outside", "a", "b", "10.1.1.0/26", ErrOutside},
		{"host bits", "a", "b", "10.0.1.1/26", ErrNotAligned},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRing(t, "10.0.0.0/16")
			mustSeed(t, r, []Lease{{"a", pfx(t, "10.0.1.0/24"), 5}}, []Tombstone{{"gone", 9}})
			before := r.Encode()
			err := r.Grant(tt.self, tt.to, pfx(t, tt.grant))
			if !errors.Is(err, tt.want) {
				t.Fatalf("Grant = %v, want %v", err, tt.want)
			}
			if string(before) != string(r.Encode()) {
				t.Fatalf("failed grant changed the ring")
			}
		})
	}
}

func TestMergeCases(t *testing.T) {
	const u = "10.0.0.0/24"
	type probe struct {
		addr    string
		owner   string
		version uint64 // epoch<<32|counter of the view token at addr
		free    uint64
	}
	tests := []struct {
		name          string
		local, remote []tok
		wantChanged   bool
		probes        []probe
	}{
		{
			name:        "identical",
			local:       []tok{{"10.0.0.0", "a", 1, 0, 10}},
			remote:      []tok{{"10.0.0.0", "a", 1, 0, 10}},
			wantChanged: false,
			probes:      []probe{{"10.0.0.9", "a", 1 << 32, 10}},
		},
		{
			name:        "token only in remote",
			local:       []tok{{"10.0.0.0", "a", 1, 0, 10}},
			remote:      []tok{{"10.0.0.0", "a", 1, 0, 10}, {"10.0.0.128", "b", 1, 1, 5}},
			wantChanged: true,
			probes:      []probe{{"10.0.0.1", "a", 1 << 32, 10}, {"10.0.0.200", "b", 1<<32 | 1, 5}},
		},
		{
			name:        "token only in local",
			local:       []tok{{"10.0.0.0", "a", 1, 0, 10}, {"10.0.0.128", "b", 1, 1, 5}},
			remote:      []tok{{"10.0.0.0", "a", 1, 0, 10}},
			wantChanged: false,
			probes:      []probe{{"10.0.0.200", "b", 1<<32 | 1, 5}},
		},
		{
			name:        "remote newer version wins",
			local:       []tok{{"10.0.0.0", "a", 1, 0, 10}},
			remote:      []tok{{"10.0.0.0", "b", 1, 1, 3}},
			wantChanged: true,
			probes:      []probe{{"10.0.0.0", "b", 1<<32 | 1, 3}},
		},
		{
			name:        "remote older version loses",
			local:       []tok{{"10.0.0.0", "b", 1, 1, 3}},
			remote:      []tok{{"10.0.0.0", "a", 1, 0, 10}},
			wantChanged: false,
			probes:      []probe{{"10.0.0.0", "b", 1<<32 | 1, 3}},
		},
		{
			name:        "version tie: greater owner wins (remote greater)",
			local:       []tok{{"10.0.0.0", "a", 2, 0, 10}},
			remote:      []tok{{"10.0.0.0", "b", 2, 0, 10}},
			wantChanged: true,
			probes:      []probe{{"10.0.0.0", "b", 2 << 32, 10}},
		},
		{
			name:        "version tie: greater owner wins (local greater)",
			local:       []tok{{"10.0.0.0", "b", 2, 0, 10}},
			remote:      []tok{{"10.0.0.0", "a", 2, 0, 10}},
			wantChanged: false,
			probes:      []probe{{"10.0.0.0", "b", 2 << 32, 10}},
		},
		{
			name:        "owner tie: lower free wins (remote lower)",
			local:       []tok{{"10.0.0.0", "a", 2, 0, 10}},
			remote:      []tok{{"10.0.0.0", "a", 2, 0, 4}},
			wantChanged: true,
			probes:      []probe{{"10.0.0.0", "a", 2 << 32, 4}},
		},
		{
			name:        "owner tie: lower free wins (local lower)",
			local:       []tok{{"10.0.0.0", "a", 2, 0, 4}},
			remote:      []tok{{"10.0.0.0", "a", 2, 0, 10}},
			wantChanged: false,
			probes:      []probe{{"10.0.0.0", "a", 2 << 32, 4}},
		},
		{
			name:        "inserted token clamps a free count",
			local:       []tok{{"10.0.0.0", "a", 2, 0, 200}},
			remote:      []tok{{"10.0.0.0", "a", 1, 0, 10}, {"10.0.0.16", "", 0, 0, 0}},
			wantChanged: true,
			probes:      []probe{{"10.0.0.0", "a", 2 << 32, 16}, {"10.0.0.16", "", 0, 0}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, r := rawRing(t, u, tt.local...), rawRing(t, u, tt.remote...)
			changed, err := l.Merge(r)
			if err != nil {
				t.Fatalf("Merge: %v", err)
			}
			if changed != tt.wantChanged {
				t.Errorf("changed = %v, want %v", changed, tt.wantChanged)
			}
			for _, p := range tt.probes {
				a := ip(t, p.addr)
				x, _ := l.u.offset(a)
				v := l.st.view[find(l.st.view, x)]
				if v.owner != p.owner || v.version != p.version || v.free != U128(p.free) {
					t.Errorf("at %s: %q v%d.%d free %v, want %q v%d.%d free %d\n%v", p.addr,
						v.owner, v.version>>32, v.version&counterMask, v.free,
						p.owner, p.version>>32, p.version&counterMask, p.free, l)
				}
			}
			checkValid(t, l)
			// The other direction gives the same ring.
			r2 := rawRing(t, u, tt.remote...)
			if _, err := r2.Merge(rawRing(t, u, tt.local...)); err != nil {
				t.Fatalf("reverse Merge: %v", err)
			}
			if !r2.Equal(l) {
				t.Fatalf("merge is not commutative:\n%v\n%v", l, r2)
			}
		})
	}
}

func TestMergeRefusesBadRemote(t *testing.T) {
	local := newRing(t, "10.0.0.0/16")
	mustSeed(t, local, []Lease{{"a", pfx(t, "10.0.1.0/24"), 5}}, nil)
	tests := []struct {
		name   string
		remote *Ring
		want   error
	}{
		{"other universe", newRing(t, "10.1.0.0/16"), ErrOtherUniverse},
		{"other family", newRing(t, "fd00::/112"), ErrOtherUniverse},
		{"nil", nil, ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := local.Encode()
			changed, err := local.Merge(tt.remote)
			if !errors.Is(err, tt.want) || changed {
				t.Fatalf("Merge = %v, %v; want %v", changed, err, tt.want)
			}
			if string(before) != string(local.Encode()) {
				t.Fatalf("refused merge changed the ring")
			}
		})
	}
}

func TestTransfer(t *testing.T) {
	r := newRing(t, "10.0.0.0/16")
	mustSeed(t, r, []Lease{{"a", pfx(t, "10.0.1.0/24"), 5}, {"d", pfx(t, "10.0.2.0/24"), 6}, {"gone", pfx(t, "10.0.3.0/24"), 7}}, nil)
	if err := r.Grant("a", "d", pfx(t, "10.0.1.128/25")); err != nil {
		t.Fatal(err)
	}
	mustSeed(t, r, nil, []Tombstone{{"gone", 10}})
	// The departed peer d bumped its token concurrently, several times.
	concurrent := r.Clone()
	for i := range 5 {
		if _, err := concurrent.ReportFree("d", map[netip.Addr]Uint128{ip(t, "10.0.2.0"): U128(uint64(i))}); err != nil {
			t.Fatal(err)
		}
	}

	n, err := r.transfer("d", "c")
	if err != nil || n != 2 {
		t.Fatalf("Transfer(d) = %d, %v; want 2 ranges", n, err)
	}
	if _, err := r.Merge(concurrent); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"10.0.1.200", "10.0.2.5"} {
		if got := ownerOf(t, r, a); got != "c" {
			t.Errorf("owner(%s) = %q after transfer, want c\n%v", a, got, r)
		}
	}
	// A range emptied by a tombstone can be taken over too.
	if n, err := r.transfer("gone", "c"); err != nil || n != 1 || ownerOf(t, r, "10.0.3.1") != "c" {
		t.Fatalf("Transfer(gone) = %d, %v, owner %q", n, err, ownerOf(t, r, "10.0.3.1"))
	}
	if n, err := r.transfer("nobody", "c"); err != nil || n != 0 {
		t.Fatalf("Transfer(nobody) = %d, %v; want 0, nil", n, err)
	}
	if _, err := r.transfer("a", "gone"); !errors.Is(err, ErrDeparted) {
		t.Fatalf("Transfer to a departed peer = %v, want ErrDeparted", err)
	}
	if _, err := r.transfer("a", "a"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Transfer to itself = %v, want ErrInvalid", err)
	}
	checkValid(t, r)
}

func TestVersionExhausted(t *testing.T) {
	r := rawRing(t, "10.0.0.0/24", tok{"10.0.0.0", "a", 1, counterMask, 10})
	if err := r.Grant("a", "b", pfx(t, "10.0.0.0/26")); !errors.Is(err, ErrVersionExhausted) {
		t.Fatalf("Grant at a full counter = %v, want ErrVersionExhausted", err)
	}
	if _, err := r.transfer("a", "b"); !errors.Is(err, ErrVersionExhausted) {
		t.Fatalf("Transfer at a full counter = %v, want ErrVersionExhausted", err)
	}
}

func TestQueries(t *testing.T) {
	r := newRing(t, "10.0.0.0/16")
	mustSeed(t, r, []Lease{{"a", pfx(t, "10.0.1.0/24"), 5}, {"b", pfx(t, "10.0.2.0/24"), 6}}, nil)
	if err := r.Grant("a", "c", pfx(t, "10.0.1.64/26")); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Owner(ip(t, "10.1.0.0")); ok {
		t.Errorf("Owner outside the universe reported ok")
	}
	if _, ok := r.Owner(ip(t, "fd00::1")); ok {
		t.Errorf("Owner of another family reported ok")
	}
	want := []Range{{ip(t, "10.0.1.0"), ip(t, "10.0.1.63")}, {ip(t, "10.0.1.128"), ip(t, "10.0.1.255")}}
	if got := r.RangesOf("a"); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("RangesOf(a) = %v, want %v", got, want)
	}
	if got := r.Peers(); len(got) != 3 || got[0] != "a" || got[1] != "b" || got[2] != "c" {
		t.Errorf("Peers = %v", got)
	}
	free := r.freeByPeer()
	if free["b"] != U128(256) || free["c"] != U128(64) || free["a"] != U128(192) {
		t.Errorf("freeByPeer = %v", free)
	}
	if _, ok := r.ChoosePeerToAsk(rand.New(rand.NewPCG(1, 2)), "a", "b", "c"); ok {
		t.Errorf("ChoosePeerToAsk with everyone excluded reported a peer")
	}
}

// TestChoosePeerToAskWeights draws many times with a fixed seed and checks
// the shares against the free counts: exact weighting gives shares within a
// small tolerance, a biased one does not.
func TestChoosePeerToAskWeights(t *testing.T) {
	tests := []struct {
		name     string
		universe string
		frees    map[string]uint64 // peer -> free in its /24 (or /64)
		leases   map[string]string
		exclude  []string
	}{
		{
			name:     "ipv4",
			universe: "10.0.0.0/16",
			leases:   map[string]string{"a": "10.0.1.0/24", "b": "10.0.2.0/24", "c": "10.0.3.0/24", "d": "10.0.4.0/24", "self": "10.0.5.0/24"},
			frees:    map[string]uint64{"a": 10, "b": 30, "c": 60, "d": 0, "self": 200},
			exclude:  []string{"self"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seed := uint64(7)
			t.Logf("seed %d", seed)
			r := newRing(t, tt.universe)
			var leases []Lease
			idx := uint64(1)
			for p, l := range tt.leases {
				leases = append(leases, Lease{p, pfx(t, l), idx})
				idx++
			}
			mustSeed(t, r, leases, nil)
			for p, f := range tt.frees {
				if _, err := r.ReportFree(p, map[netip.Addr]Uint128{pfx(t, tt.leases[p]).Addr(): U128(f)}); err != nil {
					t.Fatal(err)
				}
			}
			var sum uint64
			for p, f := range tt.frees {
				if p != "self" {
					sum += f
				}
			}
			rng := rand.New(rand.NewPCG(seed, 0))
			const draws = 200000
			got := map[string]int{}
			for range draws {
				p, ok := r.ChoosePeerToAsk(rng, tt.exclude...)
				if !ok {
					t.Fatal("no peer chosen")
				}
				got[p]++
			}
			for p, f := range tt.frees {
				if p == "self" || f == 0 {
					if got[p] != 0 {
						t.Errorf("peer %s chosen %d times, want never", p, got[p])
					}
					continue
				}
				share := float64(got[p]) / draws
				want := float64(f) / float64(sum)
				if d := share - want; d > 0.005 || d < -0.005 {
					t.Errorf("peer %s share %.4f, want %.4f (seed %d)", p, share, want, seed)
				}
			}
		})
	}
}

// TestChoosePeerToAskHuge checks that free counts beyond 64 bits (IPv6) are
// weighted too: a peer with 2^64 free against one with 2^62 is chosen about
// four times as often.
func TestChoosePeerToAskHuge(t *testing.T) {
	seed := uint64(11)
	r := newRing(t, "fd00::/48")
	mustSeed(t, r, []Lease{{"big", pfx(t, "fd00:0:0:1::/64"), 1}, {"small", pfx(t, "fd00:0:0:2::/66"), 2}}, nil)
	rng := rand.New(rand.NewPCG(seed, 0))
	n := map[string]int{}
	for range 100000 {
		p, _ := r.ChoosePeerToAsk(rng)
		n[p]++
	}
	share := float64(n["big"]) / 100000
	if share < 0.79 || share > 0.81 {
		t.Fatalf("share of the /64 = %.4f, want 0.8 (seed %d)", share, seed)
	}
}

func TestReportFree(t *testing.T) {
	r := newRing(t, "10.0.0.0/16")
	mustSeed(t, r, []Lease{{"a", pfx(t, "10.0.1.0/24"), 5}}, nil)
	start := ip(t, "10.0.1.0")
	changed, err := r.ReportFree("a", map[netip.Addr]Uint128{start: U128(100)})
	if err != nil || !changed {
		t.Fatalf("ReportFree = %v, %v", changed, err)
	}
	if tk := r.Tokens()[1]; tk.Free != U128(100) || tk.Version != 5<<32|1 {
		t.Fatalf("token after ReportFree = %+v", tk)
	}
	if changed, _ := r.ReportFree("a", map[netip.Addr]Uint128{start: U128(100)}); changed {
		t.Fatalf("reporting the same count changed the ring")
	}
	if changed, _ := r.ReportFree("b", map[netip.Addr]Uint128{start: U128(1)}); changed {
		t.Fatalf("a peer reported free space in a range it does not own")
	}
	// An impossible count is capped at the range size.
	if _, err := r.ReportFree("a", map[netip.Addr]Uint128{start: U128(1000)}); err != nil {
		t.Fatal(err)
	}
	if tk := r.Tokens()[1]; tk.Free != U128(256) {
		t.Fatalf("free = %v, want capped at 256", tk.Free)
	}
	checkValid(t, r)
}

func TestRangePrefixes(t *testing.T) {
	tests := []struct {
		first, last string
		want        []string
	}{
		{"10.0.0.0", "10.0.0.255", []string{"10.0.0.0/24"}},
		{"10.0.0.1", "10.0.0.6", []string{"10.0.0.1/32", "10.0.0.2/31", "10.0.0.4/31", "10.0.0.6/32"}},
		{"0.0.0.0", "255.255.255.255", []string{"0.0.0.0/0"}},
		{"::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", []string{"::/0"}},
		{"::", "7fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", []string{"::/1"}},
		{"fd00::8000:0:0:0", "fd00::ffff:ffff:ffff:ffff", []string{"fd00::8000:0:0:0/65"}},
	}
	for _, tt := range tests {
		t.Run(tt.first+"-"+tt.last, func(t *testing.T) {
			got := Range{ip(t, tt.first), ip(t, tt.last)}.Prefixes()
			if len(got) != len(tt.want) {
				t.Fatalf("Prefixes = %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != pfx(t, tt.want[i]) {
					t.Fatalf("Prefixes = %v, want %v", got, tt.want)
				}
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
