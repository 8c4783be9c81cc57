package logcmd

import (
	"fmt"
	"net/netip"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/netconfig"
)

// maxRequestIDLen bounds a request id.
const maxRequestIDLen = 128

// maxClusterIDLen bounds a cluster id in the log.
const maxClusterIDLen = 64

// validate checks that a decoded command carries the body its op needs.
func (c Command) validate() error {
	missing := false
	switch c.Op {
	case OpRegister:
		missing = c.Register == nil
	case OpDelete:
		missing = c.Delete == nil
	case OpSetConfig:
		missing = c.SetConfig == nil
	case OpServerMeta:
		missing = c.ServerMeta == nil
	case OpCompact:
		missing = c.Compact == nil
		if !missing && (c.Compact.Now <= 0 || c.Compact.MaxAge <= 0) {
			return fmt.Errorf("%w: compact with now %d and max_age %d: want both positive", ErrBadCommand, c.Compact.Now, c.Compact.MaxAge)
		}
	case OpReport:
		missing = c.Report == nil
	case OpGrow:
		missing = c.Grow == nil
	case OpReturn:
		missing = c.Return == nil
	case OpGrant:
		missing = c.Grant == nil
	case OpRelease:
		missing = c.Release == nil
	case OpRevoke:
		missing = c.Revoke == nil
	case OpRestore:
		missing = c.Restore == nil
	case OpSetClusterID:
		if len(c.ClusterID) > maxClusterIDLen {
			return fmt.Errorf("%w: cluster_id longer than %d bytes", ErrBadCommand, maxClusterIDLen)
		}
		missing = c.ClusterID == ""
	default:
		return fmt.Errorf("%w: unknown op %q", ErrBadCommand, c.Op)
	}
	if missing {
		return fmt.Errorf("%w: %s without body", ErrBadCommand, c.Op)
	}
	return nil
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
