package ipam

// Space requests and answers (their wire format: package ipamwire): a
// donor's decision on a request, and the routing of an answer to the
// growth waiting for it. An answer carries the donor's ring, merged like
// any ring gossip (a merge that would take addresses in use is refused):
// only the ring decides what the recipient owns.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/carve-net/carve/agent/ipam/ipamstore"
	"github.com/carve-net/carve/agent/ipam/ipamwire"
	"github.com/carve-net/carve/agent/ipam/ipfamily"
	"github.com/carve-net/carve/agent/ipam/ringgossip"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
)

// onSpaceMessage handles a space request or answer (by unicast).
func (s *Service) onSpaceMessage(src string, msg []byte) error {
	m, err := ipamwire.DecodeSpaceMessage(msg)
	if err != nil {
		s.metrics.RingGossip.WithLabelValues(ringgossip.ResultBad).Inc()
		return err
	}
	if m.From != src {
		s.metrics.RingGossip.WithLabelValues(ringgossip.ResultBad).Inc()
		return fmt.Errorf("%w: sent as %q by peer %q", ipamwire.ErrBadSpaceMessage, m.From, src)
	}
	s.mu.Lock()
	cluster := s.clusterID
	s.mu.Unlock()
	if cluster != "" && m.ClusterID != cluster {
		s.metrics.RingGossip.WithLabelValues(ringgossip.ResultOtherCluster).Inc()
		return fmt.Errorf("%w: space message of cluster %q, this agent's is %q", ringgossip.ErrOtherCluster, m.ClusterID, cluster)
	}
	if m.Kind == ipamwire.KindRequest {
		s.mu.Lock()
		reason, ok := s.claims.CheckSpaceRequest(m)
		s.mu.Unlock()
		if !ok {
			s.metrics.ClaimsRefused.WithLabelValues(reason).Inc()
			return fmt.Errorf("%w: request %q from %s: %s", ipamwire.ErrBadSpaceMessage, m.ID, src, reason)
		}
		if !s.bg.Go(func(ctx context.Context) { s.donate(ctx, m) }) {
			return fmt.Errorf("request %q from %s: %w", m.ID, src, errStopping) // the asker asks again, or another peer
		}
		return nil
	}
	return s.asker.Answer(src, m)
}

// donate answers a space request: a block of the bridges' first
// sub-subnets, as large as asked or smaller, never more than half of what
// is free there, persisted and broadcast before the answer. It runs in a
// goroutine of s.bg: a service that stopped (ctx ended) decides nothing
// more, and its grant, once persisted, is still answered.
func (s *Service) donate(ctx context.Context, m ipamwire.SpaceMessage) {
	if ctx.Err() != nil {
		return // stopping: the asker's request times out and goes elsewhere
	}
	ans, b := s.decideDonation(m)
	if b != nil {
		if err := s.commits.Flush(b); err != nil {
			s.log.Error("persist a grant: not answered", "to", m.From, "err", err)
			return
		}
	}
	if ans.Kind == ipamwire.KindGrant {
		s.metrics.GrantsGiven.Inc()
		s.gossip.Announce()
		s.changed()
	}
	s.mu.Lock()
	ch := s.channel
	s.mu.Unlock()
	if ch != nil {
		if err := ch.Unicast(m.From, ipamwire.EncodeSpaceMessage(ans)); err != nil {
			s.log.Warn("answer a space request", "to", m.From, "err", err)
		}
	}
}

func (s *Service) decideDonation(m ipamwire.SpaceMessage) (ipamwire.SpaceMessage, *batch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ans := ipamwire.SpaceMessage{V: ipamwire.SpaceVersion, Kind: ipamwire.KindRefuse, ClusterID: s.clusterID, From: s.id, ID: m.ID, Overlay: m.Overlay, Family: m.Family}
	refuse := func(reason string) (ipamwire.SpaceMessage, *batch) {
		ans.Reason = reason
		s.log.Info("refused a space request", "from", m.From, "overlay", m.Overlay, "family", m.Family, "reason", reason)
		return ans, nil
	}
	fam := ipfamily.Index(m.Family)
	a := s.allocatorOf(m.Overlay, m.Family)
	if a == nil || m.From == s.id {
		return refuse("not_served")
	}
	if fam == 1 {
		return refuse(ipamwire.ReasonIPv6NotGranted)
	}
	o := s.overlays[m.Overlay]
	if s.tombstoned(s.id) {
		return refuse("deleted") // a deleted agent stops granting (obligation 2)
	}
	if s.tombstoned(m.From) {
		return refuse("recipient_deleted")
	}
	// grant answers with what the grant wrote (the ring's delta since
	// before it), or the whole ring when before is nil (a repeated
	// request: the recipient may have lost what it had).
	grant := func(p netip.Prefix, before *ring.Ring) (ipamwire.SpaceMessage, *batch) {
		enc := a.EncodeRing()
		ans.Kind, ans.Prefix, ans.Ring = ipamwire.KindGrant, p.String(), a.Ring().Claims().Encode()
		if d, ok := a.Ring().Delta(before); ok && before != nil {
			ans.Ring = d.Claims().Encode()
		}
		// The donor's word for the masters (the recipient reports the
		// grant with it).
		ans.Expires, ans.GrantSig = s.claims.SignGrant(s.clusterID, m.Overlay, p, m.From, m.ID, time.Now())
		// The request id is remembered in the grant's commit: a request
		// repeated after a restart gets this block again, not another.
		return ans, s.commits.Enqueue(change{Writes: []write{putRing(m.Overlay, fam, enc), ipamstore.PutGranted(m.From, m.ID, p)}})
	}
	key := [2]string{m.From, m.ID}
	if p, ok := s.grow.granted[key]; ok {
		if owner, _ := a.Ring().Owner(p.Addr()); owner == m.From {
			return grant(p, nil) // a repeated request: the same grant
		}
	}
	before := a.Ring()
	var within []netip.Prefix
	var free ring.Uint128
	for _, kind := range sortedKeys(o.bridges) {
		if p := o.bridges[kind][fam]; p.IsValid() {
			within = append(within, p)
			free = free.Add(a.FreeHosts(p))
		}
	}
	width := o.universe[fam].Addr().BitLen()
	room, limited := quotaRoom(o.info, before, m.From)
	overQuota := false
	for bits := max(m.Bits, o.universe[fam].Bits()+1); bits <= minBlockBits(fam); bits++ {
		log2 := width - bits
		if free.Rsh(1).Less(ring.U128(1).Lsh(uint(log2))) {
			continue // the donor keeps at least as much as it gives
		}
		if limited && room < 1<<log2 {
			overQuota = true
			continue
		}
		p, err := a.DonateBlock(m.From, within, log2)
		if errors.Is(err, ring.ErrNothingToDonate) {
			continue
		}
		if err != nil {
			return refuse("cannot_grant: " + err.Error())
		}
		s.grow.granted[key] = p
		s.log.Info("granted a block through the ring", "to", m.From, "overlay", m.Overlay, "block", p)
		return grant(p, before)
	}
	if overQuota {
		s.metrics.ClaimsRefused.WithLabelValues(ipamwire.ReasonRecipientQuota).Inc()
		return refuse(ipamwire.ReasonRecipientQuota)
	}
	return refuse("no_space")
}

// quotaRoom is how many more IPv4 addresses of grown and granted space
// recipient may hold in the overlay of info by its quota, as the ring r
// sees what it owns beyond its origin lease (one subnet of the overlay's
// prefix): grants not yet reported to the masters count too. limited is
// false when no quota applies (no IPv4 subnet).
func quotaRoom(info api.OverlayNetwork, r *ring.Ring, recipient string) (room uint64, limited bool) {
	bits, u := info.QuotaBits(false), r.Universe()
	if bits == 0 || !u.Addr().Is4() || info.Prefix < u.Bits() || info.Prefix > 32 {
		return 0, false
	}
	var held uint64
	for _, p := range r.Blocks(recipient) {
		held += 1 << (32 - p.Bits())
	}
	held -= min(held, 1<<(32-info.Prefix))
	quota := uint64(1) << (32 - bits)
	if held >= quota {
		return 0, true
	}
	return quota - held, true
}
