package api

import (
	"net"
	"net/netip"
)

// VTEPMAC derives a VTEP's MAC: the OUI's three high bytes and the VTEP IP's
// three low bytes, so it never needs storing. The masters derive it when
// they render a record; the agents check that a record's MAC is this one.
func VTEPMAC(oui [3]byte, vtep netip.Addr) net.HardwareAddr {
	a := vtep.As4()
	return net.HardwareAddr{oui[0], oui[1], oui[2], a[1], a[2], a[3]}
}
