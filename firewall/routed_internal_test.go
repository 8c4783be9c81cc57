package firewall

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// TestFamilyRules: the routed rules follow each chain's device rules, take
// only the family's prefixes, and are left out without carve devices.
func TestFamilyRules(t *testing.T) {
	r := Rules{Devices: []string{"vtep1024", "m-carve"}, Underlay: "eth0",
		Routed: []netip.Prefix{netip.MustParsePrefix("10.128.0.0/9"), netip.MustParsePrefix("fd00::/48"), netip.MustParsePrefix("10.128.0.0/9")}}
	tests := []struct {
		name string
		r    Rules
		fam  Family
		want []string
	}{
		{"ipv4", r, IPv4, []string{
			"-A CARVE-FORWARD -i m-carve -j CARVE-FORWARD-OUT",
			"-A CARVE-FORWARD -i vtep1024 -j CARVE-FORWARD-OUT",
			"-A CARVE-FORWARD -d 10.128.0.0/9 -i eth0 -j CARVE-FORWARD-OUT",
			"-A CARVE-FORWARD-OUT -o m-carve -j ACCEPT",
			"-A CARVE-FORWARD-OUT -o vtep1024 -j ACCEPT",
			"-A CARVE-FORWARD-OUT -d 10.128.0.0/9 -o eth0 -j ACCEPT",
		}},
		{"ipv6", r, IPv6, []string{
			"-A CARVE-FORWARD -i m-carve -j CARVE-FORWARD-OUT",
			"-A CARVE-FORWARD -i vtep1024 -j CARVE-FORWARD-OUT",
			"-A CARVE-FORWARD -d fd00::/48 -i eth0 -j CARVE-FORWARD-OUT",
			"-A CARVE-FORWARD-OUT -o m-carve -j ACCEPT",
			"-A CARVE-FORWARD-OUT -o vtep1024 -j ACCEPT",
			"-A CARVE-FORWARD-OUT -d fd00::/48 -o eth0 -j ACCEPT",
		}},
		{"no devices", Rules{Underlay: "eth0", Routed: r.Routed}, IPv4, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := familyRules(tt.r, tt.fam)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("rules:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
	if got := devicesOf(mustFamily(t, r, IPv4)); got != "m-carve,vtep1024" {
		t.Errorf("devicesOf = %q", got)
	}
	if _, err := familyRules(Rules{Devices: []string{"m-carve"}, Underlay: "eth+", Routed: r.Routed}, IPv4); !errors.Is(err, ErrBadDevice) {
		t.Errorf("underlay eth+: err %v, want ErrBadDevice", err)
	}
}

func mustFamily(t *testing.T, r Rules, fam Family) []string {
	t.Helper()
	rules, err := familyRules(r, fam)
	if err != nil {
		t.Fatal(err)
	}
	return rules
}
