package master

import (
	"errors"
	"net"
	"net/netip"
)

// errWildcardAddr is why a master cannot publish a wildcard address: the
// other masters reach it there (followers forward writes to the leader's
// HTTP address).
var errWildcardAddr = errors.New("a wildcard address cannot be advertised to the other masters (followers forward writes to the leader's address): give this master's own address, e.g. 198.18.0.1:8080")

// checkAdvertisable refuses a listener address that other masters cannot
// reach this master at.
func checkAdvertisable(addr net.Addr) error {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok || tcp.IP == nil || tcp.IP.IsUnspecified() {
		return errWildcardAddr
	}
	return nil
}

// checkAdvertisedAddr checks a HOST:PORT another master publishes.
func checkAdvertisedAddr(hostPort string) error {
	host, _, err := net.SplitHostPort(hostPort)
	if err != nil {
		return errors.New("want HOST:PORT")
	}
	if ip, err := netip.ParseAddr(host); host == "" || (err == nil && ip.IsUnspecified()) {
		return errWildcardAddr
	}
	return nil
}
