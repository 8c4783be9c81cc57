package main

import (
	"fmt"
	"net"
	"net/netip"
)

// checkDebugAddr accepts only a loopback IP literal and a port for
// --debug-addr: the runtime profiles are served without authentication,
// and a profile or a heap dump shows keys and records.
func checkDebugAddr(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--debug-addr %q: want LOOPBACK_IP:PORT (127.0.0.1:6060, say)", addr)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || !ip.Unmap().IsLoopback() {
		return fmt.Errorf("--debug-addr %q: %q is not a loopback IP: the profiles are served without authentication, so only 127.0.0.1 or [::1] (reach them over ssh -L)", addr, host)
	}
	return nil
}
