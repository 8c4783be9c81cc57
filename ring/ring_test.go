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
