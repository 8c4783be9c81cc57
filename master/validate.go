package master

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/carve-net/carve/api"
)

// maxRequestIDLen bounds a request id.
const maxRequestIDLen = 128

// ValidateRegistration checks a registration and names the bad field.
func ValidateRegistration(req *api.RegisterRequest) error {
	if req.AgentID == "" {
		return errors.New("agent_id is required")
	}
	if err := api.ValidateAgentID(req.AgentID); err != nil {
		return fmt.Errorf("agent_id: %w", err)
	}
	if req.IP == "" {
		return errors.New("ip is required (the agent's underlay address)")
	}
	ip, err := netip.ParseAddr(req.IP)
	if err != nil || ip.Zone() != "" {
		return fmt.Errorf("ip %q is not an IP address", req.IP)
	}
	if ip.Is4In6() {
		return fmt.Errorf("ip %q: write IPv4 addresses in dotted form", req.IP)
	}
	if ip.IsUnspecified() || ip.IsMulticast() || ip.IsLoopback() || (ip.Is4() && ip == netip.AddrFrom4([4]byte{255, 255, 255, 255})) {
		return fmt.Errorf("ip %q cannot be an agent's underlay address", req.IP)
	}
	if len(req.Hostname) > 253 || strings.ContainsFunc(req.Hostname, func(r rune) bool { return r <= ' ' || r > '~' }) {
		return fmt.Errorf("hostname %q: want at most 253 printable characters", req.Hostname)
	}
	if req.MeshAddr != "" {
		host, port, err := net.SplitHostPort(req.MeshAddr)
		if err != nil || host == "" {
			return fmt.Errorf("mesh_addr %q: want HOST:PORT", req.MeshAddr)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return fmt.Errorf("mesh_addr %q: port must be 1-65535", req.MeshAddr)
		}
	}
	return validateRequestID(req.RequestID)
}

func validateRequestID(id string) error {
	if len(id) > maxRequestIDLen {
		return fmt.Errorf("request_id: at most %d characters", maxRequestIDLen)
	}
	return nil
}

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
