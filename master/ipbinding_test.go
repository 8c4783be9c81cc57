package master

import (
	"crypto/x509"
	"net"
	"net/netip"
	"strings"
	"testing"
)

// ipNotInCertificate accepts an IP the certificate names (IPv4 mapped or
// not) and otherwise names both the IP and the certificate's, and the fix.
func TestIPNotInCertificate(t *testing.T) {
	leaf := func(ips ...string) *x509.Certificate {
		c := &x509.Certificate{}
		for _, s := range ips {
			c.IPAddresses = append(c.IPAddresses, net.ParseIP(s))
		}
		return c
	}
	tests := []struct {
		name     string
		ip       string
		leaf     *x509.Certificate
		mentions []string // none: accepted
	}{
		{"named", "198.18.0.11", leaf("198.18.0.11"), nil},
		{"one of two", "198.18.0.12", leaf("198.18.0.11", "198.18.0.12"), nil},
		{"IPv6", "fd00::11", leaf("fd00::11"), nil},
		{"another", "198.18.0.12", leaf("198.18.0.11"), []string{"may not register ip 198.18.0.12", "names only 198.18.0.11", "--ip 198.18.0.12"}},
		{"none named", "198.18.0.12", leaf(), []string{"names no IP", "carve certs issue --role agent --name h1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := ipNotInCertificate("h1", netip.MustParseAddr(tt.ip), tt.leaf)
			if (msg == "") != (tt.mentions == nil) {
				t.Fatalf("ipNotInCertificate(%s) = %q", tt.ip, msg)
			}
			for _, m := range tt.mentions {
				if !strings.Contains(msg, m) {
					t.Errorf("%q does not mention %q", msg, m)
				}
			}
		})
	}
}
