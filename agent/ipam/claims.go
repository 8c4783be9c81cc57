package ipam

// Attributed claims: this agent signs every ring token it writes with its
// claim key, and a received token joins its rings only when its writer
// signed it with the key of the writer's master-signed record and leases
// its start (ring.Ring.Admit). Leases, lease sets and tombstones never
// come from a peer. What is refused changes nothing and is counted by
// reason (carve_agent_ring_claims_refused_total).

import (
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-net/carve/api"
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
	ring.RefusedNotLessee, ring.RefusedRecordAhead, ring.RefusedLease, ring.RefusedOtherUniverse, reasonRecipientQuota}

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

// ParseClaimKey decodes a claim public key as records carry it (standard
// base64 of 32 bytes); nil for none or a malformed one.
func ParseClaimKey(s string) ed25519.PublicKey {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil
	}
	return ed25519.PublicKey(b)
}

// signClaim signs a claim's bytes with this agent's claim key; nil when it
// has none (Config.ClaimKey).
func (s *Service) signClaim() func(msg []byte) []byte {
	if s.claimKey == nil {
		return nil
	}
	key := s.claimKey
	return func(msg []byte) []byte { return ed25519.Sign(key, msg) }
}

// ownClaimValid tells whether a claim of this agent verifies under its
// current claim key; nil when it has none.
func (s *Service) ownClaimValid() func(ring.Claim) bool {
	if s.claimKey == nil {
		return nil
	}
	pub := s.claimKey.Public().(ed25519.PublicKey)
	return func(c ring.Claim) bool { return ed25519.Verify(pub, c.Msg, c.Sig) }
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
	if !ed25519.Verify(key, c.Msg, c.Sig) {
		return claimBadSignature, false
	}
	return "", true
}

// admit returns what of a received ring may join an allocator's (see
// ring.Ring.Admit), counting and logging what it refuses; s.mu is held.
func (s *Service) admit(a *ring.Allocator, e ringEntry, remote *ring.Ring) *ring.Ring {
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

// signGrant signs, as the donor, the statement of a grant (see
// api.GrantSigningBytes) that its recipient reports to the masters; the
// zero statement when this agent has no claim key. s.mu is held.
func (s *Service) signGrant(overlay string, p netip.Prefix, to, requestID string, now time.Time) (expires int64, sig string) {
	if s.claimKey == nil {
		return 0, ""
	}
	g := api.GrantReport{Overlay: overlay, Prefix: p.String(), Donor: s.id, Recipient: to, RequestID: requestID,
		Expires: now.Add(api.GrantLifetime).Unix()}
	api.SignGrant(s.claimKey, &g, s.clusterID)
	return g.Expires, g.DonorSignature
}

// spaceDomain starts the signed bytes of a space request.
const spaceDomain = "carve space request v1\x00"

// spaceSigningBytes is what a requester signs: the domain and the request
// without its signature, as JSON (the receiver encodes the decoded
// request again: Go's encoding of the same struct is the same bytes).
func spaceSigningBytes(m spaceMessage) []byte {
	m.Sig = ""
	return append([]byte(spaceDomain), encodeSpaceMessage(m)...)
}

// signSpaceRequest signs a request with this agent's claim key (none
// without one).
func (s *Service) signSpaceRequest(m *spaceMessage) {
	if s.claimKey != nil {
		m.Sig = api.Sign(s.claimKey, spaceSigningBytes(*m))
	}
}

// checkSpaceRequest verifies a request's signature under its sender's
// claim key: a donor grants only to the agent that asked (anyone on the
// mesh could otherwise have it give its space away in another's name).
// s.mu is held.
func (s *Service) checkSpaceRequest(m spaceMessage) (reason string, ok bool) {
	if s.claimKey == nil {
		return "", true
	}
	sig, err := base64.StdEncoding.DecodeString(m.Sig)
	switch {
	case m.Sig == "":
		return claimUnsigned, false
	case s.tombstoned(m.From):
		return claimDeletedSigner, false
	case s.claimKeys[m.From] == nil:
		return claimUnknownSigner, false
	case err != nil || !ed25519.Verify(s.claimKeys[m.From], spaceSigningBytes(m), sig):
		return claimBadSignature, false
	}
	return "", true
}

// checkGrantStatement verifies a grant answer's signed statement under the
// donor's claim key, as the masters will (api.VerifyGrant); s.mu is held.
func (s *Service) checkGrantStatement(overlay, donor string, p netip.Prefix, requestID string, ans spaceMessage, now time.Time) error {
	if s.claimKey == nil {
		return nil
	}
	g := api.GrantReport{Overlay: overlay, Prefix: p.String(), Donor: donor, Recipient: s.id, RequestID: requestID,
		Expires: ans.Expires, DonorSignature: ans.GrantSig}
	key := ""
	if k := s.claimKeys[donor]; k != nil {
		key = base64.StdEncoding.EncodeToString(k)
	}
	return api.VerifyGrant(g, key, s.clusterID, now)
}
