package wireguard

import "net/netip"

// What WireGuard adds to every packet it carries: the outer IP header, UDP
// (8) and its own header and tag (32).
const (
	OverheadIPv4 = 60
	OverheadIPv6 = 80
)

// Overhead is what WireGuard adds to a packet whose outer header is of
// local's family (the underlay's).
func Overhead(local netip.Addr) int {
	if local.Unmap().Is4() {
		return OverheadIPv4
	}
	return OverheadIPv6
}
