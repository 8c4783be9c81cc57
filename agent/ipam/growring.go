package ipam

// Growth through the ring, the Service's side (package spaceask asks): the
// overlay family's ring to choose a peer from, and the answer's ring merged;
// the grant counts only once the merged ring gives the block to this agent.

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/carve-net/carve/agent/ipam/growth"
	"github.com/carve-net/carve/agent/ipam/ipamstore"
	"github.com/carve-net/carve/agent/ipam/ipamwire"
	"github.com/carve-net/carve/agent/ipam/spaceask"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/ring"
)

// askingBridge is the bridge an overlay family asks space for now (mesos
// when none). The caller holds s.mu.
func (s *Service) askingBridge(overlay string, fam int) string {
	if b, ok := s.asker.AskingBridge(overlay, fam); ok {
		return b
	}
	return api.BridgeMesos
}

// askHost is the Service as the owner of what its asker asks space for
// (spaceask.Host).
type askHost Service

func (h *askHost) Ring(overlay, bridge string, fam int) (*ring.Ring, int, bool) {
	s := (*Service)(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.overlays[overlay]
	if o == nil || o.Alloc[fam] == nil || s.channel == nil {
		return nil, 0, false
	}
	return o.Alloc[fam].Ring(), o.Bridges[bridge][fam].Bits(), true
}

func (h *askHost) Channel() (gossip.Channel, string) {
	s := (*Service)(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.channel, s.clusterID
}

func (h *askHost) Sign(m *ipamwire.SpaceMessage) { (*Service)(h).claims.SignSpaceRequest(m) }

func (h *askHost) Accept(overlay, bridge string, fam int, peer string, ans ipamwire.SpaceMessage) error {
	return (*Service)(h).acceptAnswer(growth.Key{Overlay: overlay, Bridge: bridge, Fam: fam}, peer, ans)
}

// acceptAnswer merges a grant's ring; the block counts only if the ring
// then gives it to this agent. A grant is reported to the masters.
func (s *Service) acceptAnswer(k growth.Key, peer string, ans ipamwire.SpaceMessage) error {
	if ans.Kind == ipamwire.KindRefuse {
		return &spaceask.RefusedError{Peer: peer, Reason: ans.Reason}
	}
	p, _ := netip.ParsePrefix(ans.Prefix) // validated
	s.mu.Lock()
	deleted := s.tombstoned(peer)
	stmtErr := s.claims.CheckGrantStatement(s.clusterID, k.Overlay, peer, p, ans.ID, ans, time.Now())
	s.mu.Unlock()
	if deleted {
		// Obligation 2 (docs/design.md): no grant from a deleted donor.
		return &spaceask.RefusedError{Peer: peer, Reason: "donor_deleted"}
	}
	if stmtErr != nil {
		// Without the donor's word the masters would refuse the report:
		// the block could never be recorded as this agent's.
		s.log.Warn("refused a grant without its donor's valid statement", "donor", peer, "block", p, "err", stmtErr)
		return &spaceask.RefusedError{Peer: peer, Reason: "bad_grant_statement"}
	}
	// The one range beyond the masters' records this agent may adopt: the
	// grant it asked for, whose statement it just verified (mayAdopt).
	s.mu.Lock()
	s.expectedGrants[k.Overlay] = append(s.expectedGrants[k.Overlay], p)
	s.mu.Unlock()
	_, mergeErr := s.mergeRings(ipamwire.RingMessage{ClusterID: ans.ClusterID, Rings: []ipamwire.RingEntry{{Overlay: k.Overlay, Family: ans.Family, Ring: ans.Ring}}})
	s.mu.Lock()
	s.expectedGrants[k.Overlay] = slices.DeleteFunc(s.expectedGrants[k.Overlay], func(e netip.Prefix) bool { return e == p })
	if len(s.expectedGrants[k.Overlay]) == 0 {
		delete(s.expectedGrants, k.Overlay)
	}
	s.mu.Unlock()
	if mergeErr != nil {
		return &spaceask.RefusedError{Peer: peer, Reason: "bad_ring: " + mergeErr.Error()}
	}
	s.mu.Lock()
	o := s.overlays[k.Overlay]
	var hb *heldBlock
	if o != nil {
		hb = o.Held(k.Fam, p)
	}
	if hb == nil || !hb.Prefix.Contains(p.Addr()) {
		s.mu.Unlock()
		return &spaceask.RefusedError{Peer: peer, Reason: fmt.Sprintf("bad_grant: the ring does not give %s to this agent", p)}
	}
	b := s.commits.Enqueue(change{Writes: []write{ipamstore.PutOutbox(ipamstore.OutboxEntry{Kind: ipamstore.OutboxGrant, Overlay: k.Overlay, Prefix: hb.Prefix,
		Donor: peer, Recipient: s.id, Bridge: hb.Bridge, RequestID: ans.ID, Expires: ans.Expires, DonorSignature: ans.GrantSig})}})
	s.mu.Unlock()
	s.metrics.GrantsReceived.Inc()
	if err := s.commits.Flush(b); err != nil {
		s.log.Error("persist the report of a grant", "err", err)
	}
	s.reports.Kick()
	return nil
}
