package ipam

// Attributed claims: this agent signs every ring token it writes with its
// claim key, and a received token joins its rings only when its writer
// signed it with the key of the writer's master-signed record and leases
// its start (ring.Ring.Admit). Leases, lease sets and tombstones never
// come from a peer. What is refused changes nothing and is counted by
// reason (carve_agent_ring_claims_refused_total).

import (
	"crypto/ed25519"
	"fmt"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-net/carve/agent/ipam/ipamwire"
	"github.com/carve-net/carve/ring"
)

// Reasons of refused claims beyond ring.Admit's own (the label of
// carve_agent_ring_claims_refused_total).
const (
	claimUnsigned      = "unsigned"       // no signature
	claimUnknownSigner = "unknown_signer" // no record, or a record without a claim key
	claimBadSignature  = "bad_signature"  // does not verify under the signer's claim key
	claimDeletedSigner = "deleted_signer" // the masters deleted the signer
	// unsolicitedGrant: the ring gives this agent a range another host
	// granted it, which it never asked for: shown in the ring, never used
	// (mayAdopt).
	unsolicitedGrant = "unsolicited_grant"
)

// claimReasons are every reason of a refused claim.
var claimReasons = []string{claimUnsigned, claimUnknownSigner, claimBadSignature, claimDeletedSigner, unsolicitedGrant,
	ring.RefusedNotLessee, ring.RefusedRecordAhead, ring.RefusedLease, ring.RefusedOtherUniverse, ipamwire.ReasonRecipientQuota}

// newClaimsRefused is the counter of refused claims, every reason at 0.
func newClaimsRefused() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "carve_agent_ring_claims_refused_total",
		Help: "Ring entries and space requests received and refused, by reason (unsigned, unknown_signer, bad_signature, deleted_signer, not_lessee, record_ahead, lease_from_gossip, other_universe: a ring of another overlay's or family's space, refused whole; recipient_quota: a request for space from a peer at its quota; unsolicited_grant: a range another host granted this agent without its asking, never used): forged, unattributed or over-reaching claims, which change nothing. record_ahead may also be news of a record this agent has not seen yet (anti-entropy brings it again).",
	}, []string{"reason"})
	for _, r := range claimReasons {
		c.WithLabelValues(r)
	}
	return c
}

// signClaim signs a claim's bytes with this agent's claim key; nil when it
// has none (Config.ClaimKey).
func (s *Service) signClaim() func(msg []byte) []byte {
	if s.claimKey == nil {
		return nil
	}
	return ipamwire.SignClaims(s.claimKey)
}

// ownClaimValid tells whether a claim of this agent verifies under its
// current claim key; nil when it has none.
func (s *Service) ownClaimValid() func(ring.Claim) bool {
	if s.claimKey == nil {
		return nil
	}
	pub := s.claimKey.Public().(ed25519.PublicKey)
	return func(c ring.Claim) bool { return ipamwire.VerifyClaim(pub, c) }
}

// checkClaim verifies a received token's signature under its signer's
// claim key from the view's records; s.mu is held. An agent without a
// claim key of its own (Config.ClaimKey nil: --insecure labs, tests)
// checks no signature, only who leases what (ring.Admit).
func (s *Service) checkClaim(c ring.Claim) (reason string, ok bool) {
	if s.claimKey == nil {
		return "", true
	}
	if len(c.Sig) == 0 {
		return claimUnsigned, false
	}
	if s.tombstoned(c.Signer) {
		return claimDeletedSigner, false
	}
	key := s.claimKeys[c.Signer]
	if key == nil {
		return claimUnknownSigner, false
	}
	if !ipamwire.VerifyClaim(key, c) {
		return claimBadSignature, false
	}
	return "", true
}

// admit returns what of a received ring may join an allocator's (see
// ring.Ring.Admit), counting and logging what it refuses; s.mu is held.
func (s *Service) admit(a *ring.Allocator, e ipamwire.RingEntry, remote *ring.Ring) *ring.Ring {
	admitted, refused := a.Ring().Admit(remote, s.checkClaim)
	for _, r := range refused {
		s.metrics.claimsRefused.WithLabelValues(r.Reason).Inc()
	}
	if len(refused) > 0 {
		first := refused[0]
		s.log.Debug("refused ring claims", "overlay", e.Overlay, "family", e.Family, "count", len(refused),
			"reason", first.Reason, "signer", first.Claim.Signer, "start", first.Claim.Start, "owner", first.Claim.Owner)
	}
	return admitted
}

// learnClaimKeys keeps the claim key of every peer of the view; s.mu is
// held.
func (s *Service) learnClaimKeys(v View) {
	keys := make(map[string]ed25519.PublicKey, len(v.Peers))
	for _, p := range v.Peers {
		if p.ClaimKey != nil {
			keys[p.ID] = p.ClaimKey
		}
	}
	s.claimKeys = keys
}

// validClaimKey checks a configured claim key.
func validClaimKey(k ed25519.PrivateKey) error {
	if k != nil && len(k) != ed25519.PrivateKeySize {
		return fmt.Errorf("ipam: claim key of %d bytes, want an ed25519 private key of %d", len(k), ed25519.PrivateKeySize)
	}
	return nil
}

// signGrant signs, as the donor, the statement of a grant that its
// recipient reports to the masters (ipamwire.SignGrant); the zero
// statement when this agent has no claim key. s.mu is held.
func (s *Service) signGrant(overlay string, p netip.Prefix, to, requestID string, now time.Time) (expires int64, sig string) {
	if s.claimKey == nil {
		return 0, ""
	}
	g := ipamwire.Grant{Overlay: overlay, Prefix: p, Donor: s.id, Recipient: to, RequestID: requestID}
	return ipamwire.SignGrant(s.claimKey, s.clusterID, g, now)
}

// signSpaceRequest signs a request with this agent's claim key (none
// without one).
func (s *Service) signSpaceRequest(m *ipamwire.SpaceMessage) {
	if s.claimKey != nil {
		ipamwire.SignSpaceRequest(s.claimKey, m)
	}
}

// checkSpaceRequest verifies a request's signature under its sender's
// claim key: a donor grants only to the agent that asked (anyone on the
// mesh could otherwise have it give its space away in another's name).
// s.mu is held.
func (s *Service) checkSpaceRequest(m ipamwire.SpaceMessage) (reason string, ok bool) {
	if s.claimKey == nil {
		return "", true
	}
	switch {
	case m.Sig == "":
		return claimUnsigned, false
	case s.tombstoned(m.From):
		return claimDeletedSigner, false
	case s.claimKeys[m.From] == nil:
		return claimUnknownSigner, false
	case ipamwire.VerifySpaceRequest(s.claimKeys[m.From], m) != nil:
		return claimBadSignature, false
	}
	return "", true
}

// checkGrantStatement verifies a grant answer's signed statement under the
// donor's claim key, as the masters will (ipamwire.VerifyGrant); s.mu is
// held.
func (s *Service) checkGrantStatement(overlay, donor string, p netip.Prefix, requestID string, ans ipamwire.SpaceMessage, now time.Time) error {
	if s.claimKey == nil {
		return nil
	}
	g := ipamwire.Grant{Overlay: overlay, Prefix: p, Donor: donor, Recipient: s.id, RequestID: requestID}
	return ipamwire.VerifyGrant(s.claimKeys[donor], s.clusterID, g, ans, now)
}
