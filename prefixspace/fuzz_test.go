package prefixspace_test

import (
	"net/netip"
	"testing"

	"github.com/carve-net/carve/prefixspace"
)

// fuzzPrefix makes a prefix of raw bytes (4 for IPv4, 16 for IPv6) and a
// length taken modulo the family's width plus one; host bits stay as given.
func fuzzPrefix(b []byte, bits uint8) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(b)
	if !ok {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(a, int(bits)%(a.BitLen()+1)), true
}

// FuzzSubtract checks Subtract and CutOut against the math/big model on
// any two prefixes: inside, apart, equal, of other families, with host
// bits set.
func FuzzSubtract(f *testing.F) {
	for _, s := range []struct{ outer, inner string }{
		{"10.0.0.0/24", "10.0.0.32/27"},
		{"10.0.0.0/25", "10.0.0.0/26"},
		{"10.0.0.0/24", "10.0.0.0/24"},
		{"10.0.0.0/24", "10.0.1.0/26"},
		{"0.0.0.0/0", "255.255.255.255/32"},
		{"fd00::/64", "fd00::8000:0:0:0/65"},
		{"::/0", "::1/128"},
		{"::/0", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128"},
		{"10.0.0.0/8", "fd00::/8"},
	} {
		o, i := netip.MustParsePrefix(s.outer), netip.MustParsePrefix(s.inner)
		f.Add(o.Addr().AsSlice(), uint8(o.Bits()), i.Addr().AsSlice(), uint8(i.Bits()))
	}
	f.Fuzz(func(t *testing.T, ob []byte, obits uint8, ib []byte, ibits uint8) {
		outer, ok1 := fuzzPrefix(ob, obits)
		inner, ok2 := fuzzPrefix(ib, ibits)
		if !ok1 || !ok2 {
			return
		}
		if err := checkSubtract(outer, inner, prefixspace.Subtract(outer, inner)); err != nil {
			t.Fatal(err)
		}
		if err := checkCutOut(outer, inner, prefixspace.CutOut(outer, inner)); err != nil {
			t.Fatal(err)
		}
		if err := checkCutOut(inner, outer, prefixspace.CutOut(inner, outer)); err != nil {
			t.Fatal(err)
		}
	})
}
