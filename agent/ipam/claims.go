package ipam

// Attributed claims (package claimkeys): a received token joins this
// agent's rings only when its writer signed it with the key of its
// master-signed record and leases its start (ring.Ring.Admit).

import (
	"crypto/ed25519"

	"github.com/carve-net/carve/agent/ipam/claimkeys"
	"github.com/carve-net/carve/agent/ipam/ipamwire"
	"github.com/carve-net/carve/ring"
)

// unsolicitedGrant: the ring gives this agent a range another host
// granted it, which it never asked for: shown in the ring, never used
// (overlayspace's mayAdopt).
const unsolicitedGrant = claimkeys.ReasonUnsolicitedGrant

// admit returns what of a received ring may join an allocator's (see
// ring.Ring.Admit), counting and logging what it refuses; s.mu is held.
func (s *Service) admit(a *ring.Allocator, e ipamwire.RingEntry, remote *ring.Ring) *ring.Ring {
	admitted, refused := a.Ring().Admit(remote, s.claims.CheckClaim)
	for _, r := range refused {
		s.metrics.ClaimsRefused.WithLabelValues(r.Reason).Inc()
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
	s.claims.SetPeers(keys)
}
