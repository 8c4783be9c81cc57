// Package claimkeys is who may write what in an agent's rings, by key:
// this agent signs every ring token it writes, every grant it makes and
// every space request it sends with its claim key, and a received token,
// grant statement or request counts only when its writer signed it with
// the claim key of the writer's master-signed record (ring.Ring.Admit
// then checks that the writer leases where it writes). Leases, lease sets
// and tombstones never come from a peer. What is refused changes nothing
// and is counted by reason (carve_agent_ring_claims_refused_total). The
// signatures and the bytes they cover are package ipamwire's.
//
// An agent without a claim key (--insecure labs, tests) signs nothing and
// checks no signature, only who leases what.
//
// Its exported surface is this file.
package claimkeys

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
	ReasonUnsigned      = "unsigned"       // no signature
	ReasonUnknownSigner = "unknown_signer" // no record, or a record without a claim key
	ReasonBadSignature  = "bad_signature"  // does not verify under the signer's claim key
	ReasonDeletedSigner = "deleted_signer" // the masters deleted the signer
	// ReasonUnsolicitedGrant: the ring gives this agent a range another
	// host granted it, which it never asked for: shown in the ring, never
	// used.
	ReasonUnsolicitedGrant = "unsolicited_grant"
)

// Reasons are every reason of a refused claim.
func Reasons() []string {
	return []string{ReasonUnsigned, ReasonUnknownSigner, ReasonBadSignature, ReasonDeletedSigner, ReasonUnsolicitedGrant,
		ring.RefusedNotLessee, ring.RefusedRecordAhead, ring.RefusedLease, ring.RefusedOtherUniverse, ipamwire.ReasonRecipientQuota}
}

// NewRefusedCounter is the counter of refused claims, every reason at 0.
func NewRefusedCounter() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "carve_agent_ring_claims_refused_total",
		Help: "Ring entries and space requests received and refused, by reason (unsigned, unknown_signer, bad_signature, deleted_signer, not_lessee, record_ahead, lease_from_gossip, other_universe: a ring of another overlay's or family's space, refused whole; recipient_quota: a request for space from a peer at its quota; unsolicited_grant: a range another host granted this agent without its asking, never used): forged, unattributed or over-reaching claims, which change nothing. record_ahead may also be news of a record this agent has not seen yet (anti-entropy brings it again).",
	}, []string{"reason"})
	for _, r := range Reasons() {
		c.WithLabelValues(r)
	}
	return c
}

// Valid checks a configured claim key (nil: none).
func Valid(k ed25519.PrivateKey) error {
	if k != nil && len(k) != ed25519.PrivateKeySize {
		return fmt.Errorf("ipam: claim key of %d bytes, want an ed25519 private key of %d", len(k), ed25519.PrivateKeySize)
	}
	return nil
}

// Keys are this agent's claim key and its peers' (from their records).
// It has no lock: its owner serializes the calls (the IPAM's lock).
type Keys struct {
	self  string
	key   ed25519.PrivateKey // nil: none
	peers map[string]ed25519.PublicKey
	// deleted tells whether the masters deleted an agent, as far as the
	// owner's view says (called with the owner's lock held).
	deleted func(id string) bool
}

// New returns the keys of agent self (key nil: none); deleted tells
// whether the masters deleted an agent.
func New(self string, key ed25519.PrivateKey, deleted func(id string) bool) *Keys {
	return &Keys{self: self, key: key, deleted: deleted}
}

// SetPeers replaces the peers' claim keys, by agent id (those of the
// view's records).
func (k *Keys) SetPeers(peers map[string]ed25519.PublicKey) { k.peers = peers }

// Signer signs a claim's bytes with this agent's claim key; nil when it
// has none.
func (k *Keys) Signer() func(msg []byte) []byte {
	if k.key == nil {
		return nil
	}
	return ipamwire.SignClaims(k.key)
}

// OwnClaimValid tells whether a claim of this agent verifies under its
// current claim key; nil when it has none.
func (k *Keys) OwnClaimValid() func(ring.Claim) bool {
	if k.key == nil {
		return nil
	}
	pub := k.key.Public().(ed25519.PublicKey)
	return func(c ring.Claim) bool { return ipamwire.VerifyClaim(pub, c) }
}

// CheckClaim verifies a received token's signature under its signer's
// claim key (ring.Ring.Admit's check).
func (k *Keys) CheckClaim(c ring.Claim) (reason string, ok bool) {
	if k.key == nil {
		return "", true
	}
	if len(c.Sig) == 0 {
		return ReasonUnsigned, false
	}
	if k.deleted(c.Signer) {
		return ReasonDeletedSigner, false
	}
	key := k.peers[c.Signer]
	if key == nil {
		return ReasonUnknownSigner, false
	}
	if !ipamwire.VerifyClaim(key, c) {
		return ReasonBadSignature, false
	}
	return "", true
}

// SignGrant signs, as the donor, the statement of a grant that its
// recipient reports to the masters (ipamwire.SignGrant); the zero
// statement without a claim key.
func (k *Keys) SignGrant(clusterID, overlay string, p netip.Prefix, to, requestID string, now time.Time) (expires int64, sig string) {
	if k.key == nil {
		return 0, ""
	}
	g := ipamwire.Grant{Overlay: overlay, Prefix: p, Donor: k.self, Recipient: to, RequestID: requestID}
	return ipamwire.SignGrant(k.key, clusterID, g, now)
}

// SignSpaceRequest signs a request with this agent's claim key (none
// without one).
func (k *Keys) SignSpaceRequest(m *ipamwire.SpaceMessage) {
	if k.key != nil {
		ipamwire.SignSpaceRequest(k.key, m)
	}
}

// CheckSpaceRequest verifies a request's signature under its sender's
// claim key: a donor grants only to the agent that asked (anyone on the
// mesh could otherwise have it give its space away in another's name).
func (k *Keys) CheckSpaceRequest(m ipamwire.SpaceMessage) (reason string, ok bool) {
	if k.key == nil {
		return "", true
	}
	switch {
	case m.Sig == "":
		return ReasonUnsigned, false
	case k.deleted(m.From):
		return ReasonDeletedSigner, false
	case k.peers[m.From] == nil:
		return ReasonUnknownSigner, false
	case ipamwire.VerifySpaceRequest(k.peers[m.From], m) != nil:
		return ReasonBadSignature, false
	}
	return "", true
}

// CheckGrantStatement verifies a grant answer's signed statement under the
// donor's claim key, as the masters will (ipamwire.VerifyGrant).
func (k *Keys) CheckGrantStatement(clusterID, overlay, donor string, p netip.Prefix, requestID string, ans ipamwire.SpaceMessage, now time.Time) error {
	if k.key == nil {
		return nil
	}
	g := ipamwire.Grant{Overlay: overlay, Prefix: p, Donor: donor, Recipient: k.self, RequestID: requestID}
	return ipamwire.VerifyGrant(k.peers[donor], clusterID, g, ans, now)
}
