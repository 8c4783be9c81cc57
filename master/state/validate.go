package state

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/netconfig"
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
	if err := req.Keys.Validate(); err != nil {
		return err
	}
	if err := api.ValidateUnderlayMTU(req.UnderlayMTU); err != nil {
		return err
	}
	return validateRequestID(req.RequestID)
}

func validateRequestID(id string) error {
	if len(id) > maxRequestIDLen {
		return fmt.Errorf("request_id: at most %d characters", maxRequestIDLen)
	}
	return nil
}

// validBridge checks a block's bridge.
func validBridge(b string) error {
	if b != api.BridgeMesos && b != api.BridgeDocker {
		return fmt.Errorf("bridge %q: want %q or %q", b, api.BridgeMesos, api.BridgeDocker)
	}
	return nil
}

// parseBlockPrefix parses a request's prefix: a CIDR without host bits.
func parseBlockPrefix(field, s string) (netip.Prefix, error) {
	p, err := netconfig.CanonicalPrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%s: %w", field, err)
	}
	return p, nil
}

// validateGrow checks a grow request and names the bad field; it returns
// the family as a number.
func validateGrow(req *api.GrowRequest) (int, error) {
	if err := api.ValidateOverlayName(req.Overlay); err != nil {
		return 0, fmt.Errorf("overlay: %w", err)
	}
	if err := validBridge(req.Bridge); err != nil {
		return 0, err
	}
	family := 0
	switch req.Family {
	case "4":
		family = 4
	case "6":
		family = 6
	default:
		return 0, fmt.Errorf("family %q: want \"4\" or \"6\"", req.Family)
	}
	return family, validateRequestID(req.RequestID)
}

// validateGrantReport checks a grant report sent by reporter.
func validateGrantReport(reporter string, req *api.GrantReport) error {
	if err := api.ValidateOverlayName(req.Overlay); err != nil {
		return fmt.Errorf("overlay: %w", err)
	}
	if _, err := parseBlockPrefix("prefix", req.Prefix); err != nil {
		return err
	}
	if err := api.ValidateAgentID(req.Donor); err != nil {
		return fmt.Errorf("donor: %w", err)
	}
	if err := api.ValidateAgentID(req.Recipient); err != nil {
		return fmt.Errorf("recipient: %w", err)
	}
	if req.Donor == req.Recipient {
		return fmt.Errorf("donor and recipient are both %q", req.Donor)
	}
	if reporter != req.Donor && reporter != req.Recipient {
		return fmt.Errorf("agent %q in the path is neither the donor %q nor the recipient %q", reporter, req.Donor, req.Recipient)
	}
	if req.Bridge != "" {
		if err := validBridge(req.Bridge); err != nil {
			return err
		}
	}
	return validateRequestID(req.RequestID)
}
