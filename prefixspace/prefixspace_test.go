package prefixspace_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/carve-net/carve/prefixspace"
)

var mp = netip.MustParsePrefix

func TestSpaceFirstFit(t *testing.T) {
	s := prefixspace.NewSpace[string](mp("10.0.0.0/22"))
	take := func(p string, holder string) {
		t.Helper()
		if err := s.Add(mp(p), holder); err != nil {
			t.Fatal(err)
		}
	}
	take("10.0.0.0/25", "a")
	take("10.0.1.0/24", "b")
	tests := []struct {
		bits int
		want string
	}{
		{24, "10.0.2.0/24"},   // the first whole free /24
		{25, "10.0.0.128/25"}, // the remainder of a's slice
		{26, "10.0.0.128/26"},
		{22, ""}, // nothing that large is free
		{21, ""}, // larger than the universe
		{33, ""}, // longer than an address
	}
	for _, tt := range tests {
		got, ok := s.FirstFree(tt.bits)
		if (tt.want == "") != !ok || (ok && got.String() != tt.want) {
			t.Errorf("FirstFree(/%d) = %v %v, want %q", tt.bits, got, ok, tt.want)
		}
	}
	if err := s.Add(mp("10.0.1.128/25"), "c"); err == nil || !strings.Contains(err.Error(), "overlaps 10.0.1.0/24 of b") {
		t.Errorf("an overlapping add: %v", err)
	}
	if err := s.Add(mp("10.0.4.0/24"), "c"); err == nil {
		t.Error("a prefix outside the universe was added")
	}
	// Fill everything, then free a piece: the floor comes back down.
	for {
		p, ok := s.FirstFree(26)
		if !ok {
			break
		}
		take(p.String(), "f")
	}
	if len(s.FreeSpans()) != 0 {
		t.Fatalf("free spans left: %v", s.FreeSpans())
	}
	if !s.Remove(mp("10.0.0.128/26")) {
		t.Fatal("remove failed")
	}
	if got, ok := s.FirstFree(26); !ok || got.String() != "10.0.0.128/26" {
		t.Errorf("after freeing a /26: %v %v", got, ok)
	}
	if _, ok := s.FirstFree(25); ok {
		t.Error("a /25 found in a space with one free /26")
	}
	if s.RemoveHeld(mp("10.0.0.0/25"), "b") {
		t.Error("RemoveHeld freed a's block for b")
	}
	if !s.RemoveHeld(mp("10.0.0.0/25"), "a") {
		t.Error("RemoveHeld did not free a's block for a")
	}
}

func TestSubtract(t *testing.T) {
	tests := []struct {
		outer, inner string
		want         []string
	}{
		{"10.0.0.0/24", "10.0.0.32/27", []string{"10.0.0.0/27", "10.0.0.64/26", "10.0.0.128/25"}},
		{"10.0.0.0/25", "10.0.0.0/26", []string{"10.0.0.64/26"}},
		{"10.0.0.0/24", "10.0.0.0/24", nil},
		{"10.0.0.0/24", "10.0.1.0/26", []string{"10.0.0.0/24"}}, // not inside: outer alone
		{"10.0.0.0/24", "10.0.0.0/23", []string{"10.0.0.0/24"}},
		{"fd00::/64", "fd00::8000:0:0:0/65", []string{"fd00::/65"}},
		{"0.0.0.0/0", "128.0.0.0/1", []string{"0.0.0.0/1"}},
		{"::/0", "::1/128", nil}, // 128 pieces: checked by count below
	}
	for _, tt := range tests {
		var got []string
		for _, p := range prefixspace.Subtract(mp(tt.outer), mp(tt.inner)) {
			got = append(got, p.String())
		}
		if tt.outer == "::/0" {
			if len(got) != 128 || got[0] != "::/128" || got[127] != "8000::/1" {
				t.Errorf("::/0 - ::1/128 = %d pieces from %v", len(got), got[:min(2, len(got))])
			}
			continue
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s - %s = %v, want %v", tt.outer, tt.inner, got, tt.want)
		}
	}
}

func TestCutOut(t *testing.T) {
	tests := []struct {
		b, p string
		want []string
	}{
		{"10.0.0.0/24", "10.0.1.0/24", []string{"10.0.0.0/24"}}, // apart: b whole
		{"10.0.0.0/26", "10.0.0.0/24", nil},                     // b inside p: nothing
		{"10.0.0.0/24", "10.0.0.0/24", nil},
		{"10.0.0.0/24", "10.0.0.128/25", []string{"10.0.0.0/25"}},
	}
	for _, tt := range tests {
		var got []string
		for _, p := range prefixspace.CutOut(mp(tt.b), mp(tt.p)) {
			got = append(got, p.String())
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("CutOut(%s, %s) = %v, want %v", tt.b, tt.p, got, tt.want)
		}
	}
}

func TestPrefixNeighbours(t *testing.T) {
	tests := []struct {
		p, sibling, parent, lo, hi string
	}{
		{"10.0.0.0/24", "10.0.1.0/24", "10.0.0.0/23", "10.0.0.0/25", "10.0.0.128/25"},
		{"10.0.1.0/24", "10.0.0.0/24", "10.0.0.0/23", "10.0.1.0/25", "10.0.1.128/25"},
		{"128.0.0.0/1", "0.0.0.0/1", "0.0.0.0/0", "128.0.0.0/2", "192.0.0.0/2"},
		{"10.0.0.7/32", "10.0.0.6/32", "10.0.0.6/31", "", ""},
		{"fd00::/64", "fd00:0:0:1::/64", "fd00::/63", "fd00::/65", "fd00::8000:0:0:0/65"},
		{"::ffff/128", "::fffe/128", "::fffe/127", "", ""},
	}
	for _, tt := range tests {
		p := mp(tt.p)
		if got := prefixspace.Sibling(p).String(); got != tt.sibling {
			t.Errorf("Sibling(%s) = %s, want %s", p, got, tt.sibling)
		}
		if got := prefixspace.Parent(p).String(); got != tt.parent {
			t.Errorf("Parent(%s) = %s, want %s", p, got, tt.parent)
		}
		if tt.lo == "" {
			continue
		}
		if lo, hi := prefixspace.Halves(p); lo.String() != tt.lo || hi.String() != tt.hi {
			t.Errorf("Halves(%s) = %s %s, want %s %s", p, lo, hi, tt.lo, tt.hi)
		}
	}
	if got := prefixspace.Sibling(mp("::/0")); got != mp("::/0") {
		t.Errorf("Sibling(::/0) = %s", got)
	}
}

func TestPoolArithmetic(t *testing.T) {
	tests := []struct {
		base string
		bits int
		n    uint64
		want string
	}{
		{"10.128.0.0/9", 24, 0, "10.128.0.0/24"},
		{"10.128.0.0/9", 24, 256, "10.129.0.0/24"},
		{"10.128.0.0/9", 24, 32767, "10.255.255.0/24"},
		{"fd00::/48", 64, 1, "fd00:0:0:1::/64"},
		{"fd00::/8", 72, 1, "fd00::100:0:0:0/72"},
		{"fd00::/8", 72, 1 << 40, "fd00:1::/72"},
	}
	for _, tt := range tests {
		p := prefixspace.NewPool(mp(tt.base), tt.bits)
		got := p.PrefixAt(tt.n)
		if got.String() != tt.want {
			t.Errorf("%s /%d slice %d = %s, want %s", tt.base, tt.bits, tt.n, got, tt.want)
		}
		if n, ok := p.Number(got.Addr()); !ok || n != tt.n {
			t.Errorf("Number(%s) = %d %v, want %d", got, n, ok, tt.n)
		}
	}
	// A /48 has 2^80 host addresses; the pool numbers the first 2^62. One
	// 2^64 addresses in is none of its slices (not slice 5, its low bits).
	if n, ok := prefixspace.NewHostPool(mp("fd00::/48")).Number(netip.MustParseAddr("fd00:0:0:1::5")); ok {
		t.Errorf("Number(fd00:0:0:1::5) in the host pool of fd00::/48 = %d, want none", n)
	}
	hp := prefixspace.NewHostPool(mp("100.64.0.0/30"))
	var got []string
	for {
		n, ok := hp.Allocate("x")
		if !ok {
			break
		}
		got = append(got, hp.AddrAt(n).String())
	}
	if fmt.Sprint(got) != "[100.64.0.1 100.64.0.2]" {
		t.Errorf("host pool of a /30 gave %v", got)
	}
	if o := hp.Owner(1); o != "x" {
		t.Errorf("Owner(1) = %q, want x", o)
	}
	hp.Release(1)
	if o := hp.Owner(1); o != "" {
		t.Errorf("Owner(1) after Release = %q, want none", o)
	}
	if n, ok := hp.Allocate("y"); !ok || n != 1 {
		t.Errorf("Allocate after Release = %d %v, want the freed 1", n, ok)
	}
}
