package api

import (
	"net/netip"
	"testing"
)

func TestVTEPMAC(t *testing.T) {
	tests := []struct {
		oui  [3]byte
		vtep string
		want string
	}{
		{[3]byte{0x70, 0xb3, 0xd5}, "100.64.0.2", "70:b3:d5:40:00:02"},
		{[3]byte{0x70, 0xb3, 0xd5}, "44.128.255.1", "70:b3:d5:80:ff:01"},
		{[3]byte{0x02, 0x00, 0x00}, "10.1.2.3", "02:00:00:01:02:03"},
	}
	for _, tt := range tests {
		if got := VTEPMAC(tt.oui, netip.MustParseAddr(tt.vtep)).String(); got != tt.want {
			t.Errorf("VTEPMAC(%x, %s) = %s, want %s", tt.oui, tt.vtep, got, tt.want)
		}
	}
}
