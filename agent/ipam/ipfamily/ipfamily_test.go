package ipfamily

import (
	"net/netip"
	"testing"
)

func TestFamilies(t *testing.T) {
	for _, tc := range []struct {
		fam    int
		name   string
		number int
		addr   string
	}{
		{0, "4", 4, "10.0.0.1"},
		{1, "6", 6, "fd00::1"},
	} {
		if got := Name(tc.fam); got != tc.name {
			t.Errorf("Name(%d) = %q, want %q", tc.fam, got, tc.name)
		}
		if got := Index(tc.name); got != tc.fam {
			t.Errorf("Index(%q) = %d, want %d", tc.name, got, tc.fam)
		}
		if got := Number(tc.fam); got != tc.number {
			t.Errorf("Number(%d) = %d, want %d", tc.fam, got, tc.number)
		}
		if got := Of(netip.MustParseAddr(tc.addr)); got != tc.fam {
			t.Errorf("Of(%s) = %d, want %d", tc.addr, got, tc.fam)
		}
	}
}
