package ipam

// Growth through the ring: a space request to a peer chosen by free
// space, resent until answered, and the answer's ring merged; the grant
// counts only once the merged ring gives the block to this agent.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/carve-net/carve/agent/ipam/ipamstore"
	"github.com/carve-net/carve/agent/ipam/ipamwire"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
)

// refusedError is a peer's refusal to grant space.
type refusedError struct{ peer, reason string }

func (e *refusedError) Error() string { return fmt.Sprintf("peer %s refused: %s", e.peer, e.reason) }

// peerRefusal is a peer's last refusal (or silence) in an overlay: it is
// not asked again for RefuseMemory, unless its free count in the ring
// grew since (it freed addresses: it may grant now).
type peerRefusal struct {
	when time.Time
	free ring.Uint128 // the peer's free count in the ring then
	why  string       // the refusal, for the error that ends a growth
}

// minSpareFree is the least free count a peer's ring entries must show
// for the peer to be asked: a donor grants no block smaller than four
// addresses (minBlockBits) and keeps at least as much as it gives
// (decideDonation), and the ring's free count of a peer is never below
// what it may give (it counts its bridges' network and broadcast addresses
// too). Fewer, and asking only costs a refusal.
const minSpareFree = 8

// freeByPeer sums each peer's free counts in a ring (a lease it has not
// reported on yet counts whole).
func freeByPeer(r *ring.Ring) map[string]ring.Uint128 {
	out := map[string]ring.Uint128{}
	for _, t := range r.Tokens() {
		if t.Owner != "" {
			out[t.Owner] = out[t.Owner].Add(t.Free)
		}
	}
	return out
}

// growFromRing asks peers for a block, the ones with most free space most
// likely, each at most once, until one grants, none is left to ask or ctx
// ends. Peers that refused recently are left out while their free count
// is what it was. It fails with errOverlayFull when no peer has enough
// free addresses in the ring to spare a block (the overlay's space is in
// use), else with errNoDonor, naming each peer's refusal or silence.
func (s *Service) growFromRing(ctx context.Context, k growKey, g *growth) error {
	if k.fam == 1 {
		// Peers do not grant IPv6 space (ipamwire.ReasonIPv6NotGranted).
		s.metrics.grows.WithLabelValues("ring", "none").Inc()
		return fmt.Errorf("%w: IPv6 space is leased by the masters only, never granted through the ring", errOverlayFull)
	}
	asked := map[string]bool{}
	var outcomes []string
	for {
		s.mu.Lock()
		o := s.overlays[k.overlay]
		if o == nil || o.alloc[k.fam] == nil || s.channel == nil {
			s.mu.Unlock()
			return fmt.Errorf("%w: no ring channel to ask peers on", errNoDonor)
		}
		r := o.alloc[k.fam].Ring()
		free := freeByPeer(r)
		exclude := []string{s.id}
		var remembered []string
		spare, total := 0, ring.Uint128{} // peers that may spare a block; all peers' free
		for _, p := range sortedKeys(free) {
			if p == s.id {
				continue
			}
			total = total.Add(free[p])
			if free[p].Less(ring.U128(minSpareFree)) {
				exclude = append(exclude, p)
				continue
			}
			spare++
			switch ref, ok := s.grow.refused[[2]string{k.overlay, p}]; {
			case asked[p]:
				exclude = append(exclude, p)
			case ok && time.Since(ref.when) < s.grow.cfg.RefuseMemory && !ref.free.Less(free[p]):
				exclude = append(exclude, p)
				remembered = append(remembered, fmt.Sprintf("%s (%s ago)", ref.why, time.Since(ref.when).Round(time.Second)))
			}
		}
		peer, ok := r.ChoosePeerToAsk(s.grow.rng, exclude...)
		bits := o.bridges[k.bridge][k.fam].Bits()
		s.mu.Unlock()
		if !ok {
			s.metrics.grows.WithLabelValues("ring", "none").Inc()
			switch {
			case spare > 0:
				return fmt.Errorf("%w: %d peers report free space in the ring, and none granted a block: %s",
					errNoDonor, spare, strings.Join(append(outcomes, remembered...), "; "))
			case total.IsZero():
				return fmt.Errorf("%w: no peer reports a free address in the ring", errOverlayFull)
			}
			return fmt.Errorf("%w: no peer reports enough free addresses to spare a block (%s in all, fewer than %d at each peer, "+
				"its bridges' network and broadcast addresses included; a donor keeps at least as much as it gives, "+
				"and the smallest block is 4 addresses)", errOverlayFull, total, minSpareFree)
		}
		asked[peer] = true
		err := s.askPeer(ctx, peer, k, bits)
		if err == nil {
			s.metrics.grows.WithLabelValues("ring", "ok").Inc()
			return nil
		}
		outcomes = append(outcomes, err.Error())
		reason := "no_answer"
		var re *refusedError
		if errors.As(err, &re) {
			reason = re.reason
		}
		s.metrics.refused.WithLabelValues(reason).Inc()
		s.metrics.grows.WithLabelValues("ring", "refused").Inc()
		s.mu.Lock()
		s.grow.refused[[2]string{k.overlay, peer}] = peerRefusal{when: time.Now(), free: free[peer], why: err.Error()}
		if g != nil {
			g.asked = append(g.asked, err.Error())
		}
		s.mu.Unlock()
		if ctx.Err() != nil {
			return fmt.Errorf("%w before the growth's time ran out: %s", errNoDonor, strings.Join(outcomes, "; "))
		}
	}
}

// askingBridge is the bridge an overlay family asks space for now (mesos
// when none). The caller holds s.mu.
func (s *Service) askingBridge(overlay string, fam int) string {
	if b, ok := s.grow.asking[[2]string{overlay, familyName(fam)}]; ok {
		return b
	}
	return api.BridgeMesos
}

// askPeer sends a space request to peer, resending it until it is answered;
// the grant counts once the merged ring gives this agent the block.
func (s *Service) askPeer(ctx context.Context, peer string, k growKey, bits int) error {
	id := s.requestID()
	ch := make(chan ipamwire.SpaceMessage, 1)
	s.mu.Lock()
	s.grow.waiting[id] = waiter{peer: peer, ch: ch}
	s.grow.asking[[2]string{k.overlay, familyName(k.fam)}] = k.bridge
	channel, clusterID := s.channel, s.clusterID
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.grow.waiting, id)
		delete(s.grow.asking, [2]string{k.overlay, familyName(k.fam)})
		s.mu.Unlock()
	}()
	req := ipamwire.SpaceMessage{V: ipamwire.SpaceVersion, Kind: ipamwire.KindRequest, ClusterID: clusterID, From: s.id, ID: id,
		Overlay: k.overlay, Family: familyName(k.fam), Bits: bits}
	s.claims.SignSpaceRequest(&req)
	msg := ipamwire.EncodeSpaceMessage(req)
	for range 3 {
		if err := channel.Unicast(peer, msg); err != nil {
			return fmt.Errorf("ask %s: %w", peer, err)
		}
		timer := time.NewTimer(s.grow.cfg.AnswerTimeout)
		select {
		case ans := <-ch:
			timer.Stop()
			return s.acceptAnswer(k, peer, ans)
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
	}
	return fmt.Errorf("peer %s did not answer", peer)
}

// acceptAnswer merges a grant's ring; the block counts only if the ring
// then gives it to this agent. A grant is reported to the masters.
func (s *Service) acceptAnswer(k growKey, peer string, ans ipamwire.SpaceMessage) error {
	if ans.Kind == ipamwire.KindRefuse {
		return &refusedError{peer: peer, reason: ans.Reason}
	}
	p, _ := netip.ParsePrefix(ans.Prefix) // validated
	s.mu.Lock()
	deleted := s.tombstoned(peer)
	stmtErr := s.claims.CheckGrantStatement(s.clusterID, k.overlay, peer, p, ans.ID, ans, time.Now())
	s.mu.Unlock()
	if deleted {
		// Obligation 2 (docs/design.md): no grant from a deleted donor.
		return &refusedError{peer: peer, reason: "donor_deleted"}
	}
	if stmtErr != nil {
		// Without the donor's word the masters would refuse the report:
		// the block could never be recorded as this agent's.
		s.log.Warn("refused a grant without its donor's valid statement", "donor", peer, "block", p, "err", stmtErr)
		return &refusedError{peer: peer, reason: "bad_grant_statement"}
	}
	// The one range beyond the masters' records this agent may adopt: the
	// grant it asked for, whose statement it just verified (mayAdopt).
	s.mu.Lock()
	s.expectedGrants[k.overlay] = append(s.expectedGrants[k.overlay], p)
	s.mu.Unlock()
	_, mergeErr := s.mergeRings(ipamwire.RingMessage{ClusterID: ans.ClusterID, Rings: []ipamwire.RingEntry{{Overlay: k.overlay, Family: ans.Family, Ring: ans.Ring}}})
	s.mu.Lock()
	s.expectedGrants[k.overlay] = slices.DeleteFunc(s.expectedGrants[k.overlay], func(e netip.Prefix) bool { return e == p })
	if len(s.expectedGrants[k.overlay]) == 0 {
		delete(s.expectedGrants, k.overlay)
	}
	s.mu.Unlock()
	if mergeErr != nil {
		return &refusedError{peer: peer, reason: "bad_ring: " + mergeErr.Error()}
	}
	s.mu.Lock()
	o := s.overlays[k.overlay]
	var hb *heldBlock
	if o != nil {
		hb = o.held(k.fam, p)
	}
	if hb == nil || !hb.Prefix.Contains(p.Addr()) {
		s.mu.Unlock()
		return &refusedError{peer: peer, reason: fmt.Sprintf("bad_grant: the ring does not give %s to this agent", p)}
	}
	b := s.enqueue(change{writes: []write{ipamstore.PutOutbox(ipamstore.OutboxEntry{Kind: ipamstore.OutboxGrant, Overlay: k.overlay, Prefix: hb.Prefix,
		Donor: peer, Recipient: s.id, Bridge: hb.Bridge, RequestID: ans.ID, Expires: ans.Expires, DonorSignature: ans.GrantSig})}})
	s.mu.Unlock()
	s.metrics.grantsReceived.Inc()
	if err := s.flush(b); err != nil {
		s.log.Error("persist the report of a grant", "err", err)
	}
	s.kickOutbox()
	return nil
}
