package master

import (
	"crypto/x509"
	"net"
	"net/netip"
	"strings"
	"testing"
)

// notInCertificate accepts an IP the certificate names (IPv4 mapped or
// not) and otherwise names both the IP and the certificate's, and the fix;
// a mesh_addr's host is held to the same rule, and a host that is not an
// IP is refused.
func TestNotInCertificate(t *testing.T) {
	leaf := func(ips ...string) *x509.Certificate {
		c := &x509.Certificate{}
		for _, s := range ips {
			c.IPAddresses = append(c.IPAddresses, net.ParseIP(s))
		}
		return c
	}
	tests := []struct {
		name     string
		ip       string // registered ip ("": only meshAddr is checked)
		meshAddr string
		leaf     *x509.Certificate
		mentions []string // none: accepted
	}{
		{"named", "198.18.0.11", "", leaf("198.18.0.11"), nil},
		{"one of two", "198.18.0.12", "", leaf("198.18.0.11", "198.18.0.12"), nil},
		{"IPv6", "fd00::11", "", leaf("fd00::11"), nil},
		{"another", "198.18.0.12", "", leaf("198.18.0.11"), []string{"may not register ip 198.18.0.12", "names only 198.18.0.11", "--ip 198.18.0.12"}},
		{"none named", "198.18.0.12", "", leaf(), []string{"names no IP", "carve certs issue --role agent --name h1"}},
		{"mesh named", "", "198.18.0.11:6783", leaf("198.18.0.11"), nil},
		{"mesh on the other IP", "", "198.18.0.12:6783", leaf("198.18.0.11", "198.18.0.12"), nil},
		{"mesh IPv6", "", "[fd00::11]:6783", leaf("fd00::11"), nil},
		{"mesh unset", "", "", leaf("198.18.0.11"), nil},
		{"mesh of another host", "", "198.18.0.12:6783", leaf("198.18.0.11"),
			[]string{"may not register mesh_addr 198.18.0.12:6783", "names only 198.18.0.11", "--mesh-addr", "--ip 198.18.0.12"}},
		{"mesh by name", "", "h2.example:6783", leaf("198.18.0.11"),
			[]string{"may not register mesh_addr h2.example:6783", `"h2.example" is not an IP`, "only 198.18.0.11", "--mesh-addr IP:PORT"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := meshAddrNotInCertificate("h1", tt.meshAddr, tt.leaf)
			if tt.ip != "" {
				msg = notInCertificate("h1", "ip", tt.ip, netip.MustParseAddr(tt.ip), tt.leaf)
			}
			if (msg == "") != (tt.mentions == nil) {
				t.Fatalf("ip %q mesh_addr %q: %q", tt.ip, tt.meshAddr, msg)
			}
			for _, m := range tt.mentions {
				if !strings.Contains(msg, m) {
					t.Errorf("%q does not mention %q", msg, m)
				}
			}
		})
	}
}
