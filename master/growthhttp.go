package master

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"

	"github.com/gorilla/mux"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/internal/httpapi"
	"github.com/carve-net/carve/pki"
)

// Reasons of carve_master_grow_refused_total.
const (
	growRefusedExhausted = "exhausted"
	growRefusedInvalid   = "invalid"
	growRefusedUnknown   = "unknown_agent"
	growRefusedOther     = "other"
)

// validBridge checks a block's bridge.
func validBridge(b string) error {
	if b != api.BridgeMesos && b != api.BridgeDocker {
		return fmt.Errorf("bridge %q: want %q or %q", b, api.BridgeMesos, api.BridgeDocker)
	}
	return nil
}

// parseBlockPrefix parses a request's prefix: a CIDR without host bits.
func parseBlockPrefix(field, s string) (netip.Prefix, error) {
	p, err := parseCanonicalPrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%s: %w", field, err)
	}
	return p, nil
}

// ValidateGrow checks a grow request and names the bad field.
func ValidateGrow(req *api.GrowRequest) (int, error) {
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

func (s *server) grow(w http.ResponseWriter, r *http.Request) {
	id := mux.Vars(r)["id"]
	family := 0
	req, body, ok := readValid(w, r, func(req *api.GrowRequest) (err error) {
		if family, err = ValidateGrow(req); err != nil {
			return err
		}
		return api.ValidateAgentID(id)
	}, func() { s.m.metrics.growRefused.WithLabelValues(growRefusedInvalid).Inc() })
	if !ok {
		return
	}
	cmd := command{Op: opGrow, RequestID: req.RequestID, Grow: &growCmd{AgentID: id, Overlay: req.Overlay, Bridge: req.Bridge, Family: family}}
	res, ok := s.commitBlocks(w, r, body, cmd)
	if !ok {
		switch {
		case res.Err == nil:
		case errors.Is(res.Err, ErrOverlayExhausted):
			s.m.metrics.growRefused.WithLabelValues(growRefusedExhausted).Inc()
		case errors.Is(res.Err, ErrInvalidBlock):
			s.m.metrics.growRefused.WithLabelValues(growRefusedInvalid).Inc()
		case errors.Is(res.Err, ErrUnknownAgent):
			s.m.metrics.growRefused.WithLabelValues(growRefusedUnknown).Inc()
		default:
			s.m.metrics.growRefused.WithLabelValues(growRefusedOther).Inc()
		}
		return
	}
	s.m.metrics.grown.Inc()
	s.writeAgent(w, res.Agent)
}

func (s *server) returnBlock(w http.ResponseWriter, r *http.Request) {
	id := mux.Vars(r)["id"]
	var p netip.Prefix
	req, body, ok := readValid(w, r, func(req *api.ReturnRequest) (err error) {
		if p, err = parseBlockPrefix("prefix", req.Prefix); err != nil {
			return err
		}
		if err = api.ValidateOverlayName(req.Overlay); err != nil {
			return err
		}
		return validateRequestID(req.RequestID)
	}, nil)
	if !ok {
		return
	}
	cmd := command{Op: opReturn, RequestID: req.RequestID, Return: &returnCmd{AgentID: id, Overlay: req.Overlay, Prefix: p}}
	res, ok := s.commitBlocks(w, r, body, cmd)
	if !ok {
		return
	}
	s.m.metrics.returned.Inc()
	s.writeAgent(w, res.Agent)
}

func (s *server) reportGrant(w http.ResponseWriter, r *http.Request) {
	id := mux.Vars(r)["id"]
	req, body, ok := readValid(w, r, func(req *api.GrantReport) error { return validateGrantReport(id, req) }, nil)
	if !ok {
		return
	}
	if who, ok := requestIdentity(r); ok && who.Role == pki.RoleAgent && who.Name != req.Donor && who.Name != req.Recipient {
		s.refuse(w, r, http.StatusForbidden, api.CodeForbidden, refusedWrongAgent,
			fmt.Sprintf("agent %q may report only grants it gave or received, not one from %q to %q", who.Name, req.Donor, req.Recipient))
		return
	}
	p, _ := parseBlockPrefix("prefix", req.Prefix)
	cmd := command{Op: opGrant, RequestID: req.RequestID, Grant: &grantCmd{Overlay: req.Overlay, Prefix: p, Donor: req.Donor, Recipient: req.Recipient, Bridge: req.Bridge}}
	res, ok := s.commitBlocks(w, r, body, cmd)
	if !ok {
		return
	}
	s.m.metrics.grantsLearned.Inc()
	s.writeAgent(w, res.Agent)
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

// commitBlocks commits a growth command (on the leader, or forwarded).
func (s *server) commitBlocks(w http.ResponseWriter, r *http.Request, body []byte, cmd command) (applyResult, bool) {
	if !s.servable(w, true) {
		return applyResult{}, false
	}
	return s.commit(w, r, body, cmd)
}

// usage keeps an agent's usage report; on the leader, which is the master
// that proposes quarantine releases from the acknowledgements in them.
func (s *server) usage(w http.ResponseWriter, r *http.Request) {
	id := mux.Vars(r)["id"]
	req, body, ok := readValid(w, r, ValidateUsage, nil)
	if !ok {
		return
	}
	if !s.m.node.IsLeader() {
		s.forward(w, r, body)
		return
	}
	ans, err := s.m.table.RecordUsage(id, req)
	if err != nil {
		httpapi.WriteError(w, http.StatusNotFound, api.CodeNotFound, err.Error())
		return
	}
	if ans.Acknowledged > 0 {
		s.m.kickRelease()
	}
	httpapi.WriteJSON(w, http.StatusOK, ans)
}
