package ipam

// Space requests (package growth's Donor answers them): the Service as the
// donor's overlay table, and its decision on a request under s.mu.

import (
	"context"
	"net/netip"
	"time"

	"github.com/carve-net/carve/agent/ipam/blockaddr"
	"github.com/carve-net/carve/agent/ipam/growth"
	"github.com/carve-net/carve/agent/ipam/ipamstore"
	"github.com/carve-net/carve/agent/ipam/ipamwire"
	"github.com/carve-net/carve/agent/ipam/ipfamily"
	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/ring"
)

// onSpaceMessage handles a space request or answer (by unicast).
func (s *Service) onSpaceMessage(src string, msg []byte) error {
	return s.donor.OnSpaceMessage(src, msg)
}

// donorTable is the Service as the overlay table of its donor
// (growth.DonorTable).
type donorTable Service

func (t *donorTable) ClusterID() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.clusterID
}

func (t *donorTable) CheckRequest(m ipamwire.SpaceMessage) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.claims.CheckSpaceRequest(m)
}

func (t *donorTable) Decide(m ipamwire.SpaceMessage) (ipamwire.SpaceMessage, func() error) {
	s := (*Service)(t)
	ans, b := s.decideDonation(m)
	if b == nil {
		return ans, nil
	}
	return ans, func() error { return s.commits.Flush(b) }
}

func (t *donorTable) Granted() { t.gossip.Announce() }

func (t *donorTable) Answer(src string, m ipamwire.SpaceMessage) error { return t.asker.Answer(src, m) }

func (t *donorTable) Channel() gossip.Channel {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.channel
}

func (t *donorTable) Go(f func(ctx context.Context)) error { return (*growTable)(t).Go(f) }

// decideDonation decides the answer to a space request, and queues a
// grant's writes (the caller flushes the batch).
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
	for _, kind := range sortedKeys(o.Bridges) {
		if p := o.Bridges[kind][fam]; p.IsValid() {
			within = append(within, p)
			free = free.Add(a.FreeHosts(p))
		}
	}
	p, refusal := growth.ChooseBlock(growth.Space{Alloc: a, Within: within, Free: free, Universe: o.Universe[fam], Info: o.Info, MinBits: blockaddr.MinBits(fam)}, m.From, m.Bits)
	switch refusal {
	case "":
		s.grow.granted[key] = p
		s.log.Info("granted a block through the ring", "to", m.From, "overlay", m.Overlay, "block", p)
		return grant(p, before)
	case ipamwire.ReasonRecipientQuota:
		s.metrics.ClaimsRefused.WithLabelValues(ipamwire.ReasonRecipientQuota).Inc()
	}
	return refuse(refusal)
}
