package master

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/pki"
)

// Reasons of carve_master_auth_refusals_total for grant reports.
const (
	// refusedGrantUnsigned: a recipient reported a grant without its
	// donor's signature.
	refusedGrantUnsigned = "grant_unsigned"
	// refusedGrantBadSignature: the donor's signature does not verify
	// under the claim key of the donor's record (or it has none, or no
	// record).
	refusedGrantBadSignature = "grant_bad_signature"
	// refusedGrantExpired: the signed grant expired.
	refusedGrantExpired = "grant_expired"
)

// grantRefusalReasons are the reasons authorizeGrant refuses with.
var grantRefusalReasons = []string{refusedGrantUnsigned, refusedGrantBadSignature, refusedGrantExpired}

// authorizeGrantCaller lets an agent report only a grant it gave or
// received; any master checks it, before forwarding.
func (s *server) authorizeGrantCaller(r *http.Request, req *api.GrantReport) error {
	who, ok := requestIdentity(r)
	if ok && who.Role == pki.RoleAgent && who.Name != req.Donor && who.Name != req.Recipient {
		return &refusal{reason: refusedWrongAgent,
			msg: fmt.Sprintf("agent %q may report only grants it gave or received, not one from %q to %q", who.Name, req.Donor, req.Recipient)}
	}
	return nil
}

// authorizeGrant lets a recipient report a grant only with its donor's
// signed word (api.VerifyGrant, under the claim key the masters hold in
// the donor's record): a recipient alone cannot move another live agent's
// space to itself. It runs on the leader only (authorizeOnLeader): a
// follower's table may not hold the donor's registration or new claim key
// yet, and would refuse an honest report. Donors, operators and masters
// report any grant; without identities (--insecure) anyone does.
func (s *server) authorizeGrant(r *http.Request, req *api.GrantReport) error {
	who, ok := requestIdentity(r)
	if !ok || who.Role != pki.RoleAgent || who.Name != req.Recipient || who.Name == req.Donor {
		return nil
	}
	key := ""
	if donor, found := s.m.table.Agent(req.Donor); found {
		key = donor.Keys.Claim
	} else if _, deleted := s.m.table.Tombstone(req.Donor); deleted {
		// A deleted donor's claim key is kept with its quarantined space,
		// where alone its grants are recorded (state.applyGrant).
		var quarantined bool
		if prefix, err := netip.ParsePrefix(req.Prefix); err == nil {
			key, quarantined = s.m.table.DeletedClaimKey(req.Overlay, req.Donor, prefix)
		}
		if !quarantined || key == "" {
			// Outside its quarantine the table refuses the grant for
			// good (409 conflict, which the recipient drops; a 403 it
			// would keep sending). Space quarantined before the masters
			// kept keys (an upgrade) is recorded on the recipient's word.
			return nil
		}
	}
	err := api.VerifyGrant(*req, key, s.m.table.ClusterID(), time.Now())
	reason := refusedGrantBadSignature
	switch {
	case err == nil:
		return nil
	case errors.Is(err, api.ErrGrantUnsigned):
		reason = refusedGrantUnsigned
	case errors.Is(err, api.ErrGrantExpired):
		reason = refusedGrantExpired
	}
	return &refusal{reason: reason, msg: fmt.Sprintf("agent %q reports a grant of %s from %q without the donor's word: %v", who.Name, req.Prefix, req.Donor, err)}
}
