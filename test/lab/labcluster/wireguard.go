package labcluster

import (
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
)

// WireGuardDevice is the name of h's agent's WireGuard interface: one of
// its own, because userspace WireGuard's UAPI socket
// (/var/run/wireguard/NAME.sock) is shared by every namespace of the
// machine, so two lab hosts (or two labs) must not share a name.
func WireGuardDevice(h *Host) string {
	f := fnv.New32a()
	f.Write([]byte(h.NS.Name))
	return fmt.Sprintf("wg%08x", f.Sum32())
}

// SendUDP sends payload from container ct to dst:port over UDP, count
// times (nothing needs to listen: the packets cross the overlay anyway).
func SendUDP(ct *Container, dst netip.Addr, port uint16, payload []byte, count int) error {
	return ct.NS.Do(func() error {
		conn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, port)))
		if err != nil {
			return fmt.Errorf("labcluster: udp from %s: %w", ct.Name, err)
		}
		defer conn.Close()
		for range count {
			_, _ = conn.Write(payload) // an ICMP error of an earlier datagram may surface here
		}
		return nil
	})
}
