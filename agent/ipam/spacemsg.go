package ipam

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"time"
	"unicode"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
)

// Space requests and answers travel as unicasts on the ring channel: small
// versioned JSON objects, strictly decoded. The sender's id must be the peer
// the gossip router delivered the message from, the cluster id the
// receiver's, and an answer must match a request in flight to that peer.
// An answer carries the donor's ring, merged like any ring gossip (a merge
// that would take addresses in use is refused): only the ring decides what
// the recipient owns.

const (
	spaceVersion = 1
	kindRequest  = "request"
	kindGrant    = "grant"
	kindRefuse   = "refuse"

	// reasonIPv6NotGranted refuses a request for IPv6 space: a donor
	// grants out of its bridges' first blocks, which are on-link for its
	// own containers. IPv4 has the bridge answer ARP for the granted part
	// (proxy_arp); IPv6 would need a proxy NDP entry per address the
	// recipient hands out, so IPv6 grows at the masters only.
	reasonIPv6NotGranted = "ipv6_not_granted"
	// reasonRecipientQuota refuses a request from an agent that holds,
	// as the donor's ring sees it, its quota of grown and granted space
	// (quota_prefix) or would with any block the donor could give: the
	// masters would refuse the grant's report, and a hostile host would
	// otherwise take space beyond its cap from every peer.
	reasonRecipientQuota = "recipient_quota"

	// maxSpaceRequestBytes bounds a request (no ring in it).
	maxSpaceRequestBytes = 4 << 10
	maxRequestIDLen      = 128
	maxReasonLen         = 512
	// maxSigLen bounds a signature in standard base64 (ed25519: 88).
	maxSigLen = 128
)

// errBadSpaceMessage marks a space request or answer that is refused.
var errBadSpaceMessage = errors.New("bad space message")

// spaceMessage is a space request, or its answer.
type spaceMessage struct {
	V         int    `json:"v"`
	Kind      string `json:"kind"`
	ClusterID string `json:"cluster_id"`
	From      string `json:"from"`
	ID        string `json:"id"`
	Overlay   string `json:"overlay"`
	Family    string `json:"family"`
	// Bits is the prefix length of the block a request asks for.
	Bits int `json:"bits,omitempty"`
	// Prefix is the block a grant gives, Ring the donor's ring after it.
	Prefix string `json:"prefix,omitempty"`
	Ring   []byte `json:"ring,omitempty"`
	// Reason says why a refusal refused.
	Reason string `json:"reason,omitempty"`
	// Expires and GrantSig are a grant's signed statement (the donor's
	// signature by its claim key of api.GrantSigningBytes), which the
	// recipient reports to the masters with the grant.
	Expires  int64  `json:"expires,omitempty"`
	GrantSig string `json:"grant_sig,omitempty"`
	// Sig is a request's signature by its sender's claim key
	// (spaceSigningBytes): a donor grants only to the agent that asked.
	Sig string `json:"sig,omitempty"`
}

func encodeSpaceMessage(m spaceMessage) []byte {
	b, _ := json.Marshal(m) // strings, numbers and bytes: cannot fail
	return b
}

// decodeSpaceMessage decodes and checks a space message from the network.
func decodeSpaceMessage(b []byte) (spaceMessage, error) {
	var m spaceMessage
	if len(b) > maxRingMessageBytes {
		return m, fmt.Errorf("%w: %d bytes", errBadSpaceMessage, len(b))
	}
	if err := api.DecodeStrict(bytes.NewReader(b), &m); err != nil {
		return spaceMessage{}, fmt.Errorf("%w: %v", errBadSpaceMessage, err)
	}
	if err := m.check(len(b)); err != nil {
		return spaceMessage{}, fmt.Errorf("%w: %v", errBadSpaceMessage, err)
	}
	return m, nil
}

func (m *spaceMessage) check(size int) error {
	if m.V != spaceVersion {
		return fmt.Errorf("version %d (this agent speaks %d)", m.V, spaceVersion)
	}
	if len(m.ClusterID) > maxClusterIDLen {
		return fmt.Errorf("cluster id of %d bytes", len(m.ClusterID))
	}
	if err := api.ValidateAgentID(m.From); err != nil {
		return fmt.Errorf("from: %v", err)
	}
	if m.ID == "" || len(m.ID) > maxRequestIDLen || !printable(m.ID) {
		return fmt.Errorf("request id %q", m.ID)
	}
	if err := api.ValidateOverlayName(m.Overlay); err != nil {
		return err
	}
	if len(m.Sig) > maxSigLen {
		return fmt.Errorf("signature of %d bytes", len(m.Sig))
	}
	width := 32
	switch m.Family {
	case "4":
	case "6":
		width = 128
	default:
		return fmt.Errorf("family %q", m.Family)
	}
	switch m.Kind {
	case kindRequest:
		if size > maxSpaceRequestBytes {
			return fmt.Errorf("request of %d bytes", size)
		}
		if m.Bits < 1 || m.Bits > width || m.Prefix != "" || m.Ring != nil || m.Reason != "" || m.Expires != 0 || m.GrantSig != "" {
			return fmt.Errorf("request of a /%d block, or with answer fields", m.Bits)
		}
	case kindGrant:
		p, err := netip.ParsePrefix(m.Prefix)
		if err != nil || p.Masked() != p || p.Addr().BitLen() != width || p.Addr().Zone() != "" {
			return fmt.Errorf("granted prefix %q", m.Prefix)
		}
		if len(m.Ring) == 0 || m.Bits != 0 || m.Reason != "" || m.Sig != "" || m.Expires < 0 || len(m.GrantSig) > maxSigLen {
			return errors.New("grant without a ring, or with other fields")
		}
	case kindRefuse:
		if len(m.Reason) > maxReasonLen || !printable(m.Reason) || m.Bits != 0 || m.Prefix != "" || m.Ring != nil || m.Expires != 0 || m.GrantSig != "" || m.Sig != "" {
			return errors.New("refusal with a bad reason, or with other fields")
		}
	default:
		return fmt.Errorf("kind %q", m.Kind)
	}
	return nil
}

func printable(s string) bool {
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// onSpaceMessage handles a space request or answer (by unicast).
func (h *ringHandler) onSpaceMessage(src string, msg []byte) error {
	s := (*Service)(h)
	m, err := decodeSpaceMessage(msg)
	if err != nil {
		s.metrics.ringGossip.WithLabelValues(gossipBad).Inc()
		return err
	}
	if m.From != src {
		s.metrics.ringGossip.WithLabelValues(gossipBad).Inc()
		return fmt.Errorf("%w: sent as %q by peer %q", errBadSpaceMessage, m.From, src)
	}
	s.mu.Lock()
	cluster := s.clusterID
	s.mu.Unlock()
	if cluster != "" && m.ClusterID != cluster {
		s.metrics.ringGossip.WithLabelValues(gossipOtherCluster).Inc()
		return fmt.Errorf("%w: space message of cluster %q, this agent's is %q", ErrOtherCluster, m.ClusterID, cluster)
	}
	if m.Kind == kindRequest {
		s.mu.Lock()
		reason, ok := s.checkSpaceRequest(m)
		s.mu.Unlock()
		if !ok {
			s.metrics.claimsRefused.WithLabelValues(reason).Inc()
			return fmt.Errorf("%w: request %q from %s: %s", errBadSpaceMessage, m.ID, src, reason)
		}
		if !s.bg.Go(func(ctx context.Context) { s.donate(ctx, m) }) {
			return fmt.Errorf("request %q from %s: %w", m.ID, src, errStopping) // the asker asks again, or another peer
		}
		return nil
	}
	s.mu.Lock()
	w, ok := s.grow.waiting[m.ID]
	s.mu.Unlock()
	if !ok || w.peer != src {
		return fmt.Errorf("%w: answer %q from %s matches no request in flight", errBadSpaceMessage, m.ID, src)
	}
	select {
	case w.ch <- m:
	default: // a duplicate answer
	}
	return nil
}

// donate answers a space request: a block of the bridges' first
// sub-subnets, as large as asked or smaller, never more than half of what
// is free there, persisted and broadcast before the answer. It runs in a
// goroutine of s.bg: a service that stopped (ctx ended) decides nothing
// more, and its grant, once persisted, is still answered.
func (s *Service) donate(ctx context.Context, m spaceMessage) {
	if ctx.Err() != nil {
		return // stopping: the asker's request times out and goes elsewhere
	}
	ans, b := s.decideDonation(m)
	if b != nil {
		if err := s.flush(b); err != nil {
			s.log.Error("persist a grant: not answered", "to", m.From, "err", err)
			return
		}
	}
	if ans.Kind == kindGrant {
		s.metrics.grantsGiven.Inc()
		s.announce()
		s.changed()
	}
	s.mu.Lock()
	ch := s.channel
	s.mu.Unlock()
	if ch != nil {
		if err := ch.Unicast(m.From, encodeSpaceMessage(ans)); err != nil {
			s.log.Warn("answer a space request", "to", m.From, "err", err)
		}
	}
}

func (s *Service) decideDonation(m spaceMessage) (spaceMessage, *batch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ans := spaceMessage{V: spaceVersion, Kind: kindRefuse, ClusterID: s.clusterID, From: s.id, ID: m.ID, Overlay: m.Overlay, Family: m.Family}
	refuse := func(reason string) (spaceMessage, *batch) {
		ans.Reason = reason
		s.log.Info("refused a space request", "from", m.From, "overlay", m.Overlay, "family", m.Family, "reason", reason)
		return ans, nil
	}
	fam := familyIndex(m.Family)
	a := s.allocatorOf(m.Overlay, m.Family)
	if a == nil || m.From == s.id {
		return refuse("not_served")
	}
	if fam == 1 {
		return refuse(reasonIPv6NotGranted)
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
	grant := func(p netip.Prefix, before *ring.Ring) (spaceMessage, *batch) {
		enc := a.EncodeRing()
		ans.Kind, ans.Prefix, ans.Ring = kindGrant, p.String(), a.Ring().Claims().Encode()
		if d, ok := a.Ring().Delta(before); ok && before != nil {
			ans.Ring = d.Claims().Encode()
		}
		// The donor's word for the masters (the recipient reports the
		// grant with it).
		ans.Expires, ans.GrantSig = s.signGrant(m.Overlay, p, m.From, m.ID, time.Now())
		// The request id is remembered in the grant's commit: a request
		// repeated after a restart gets this block again, not another.
		return ans, s.enqueue(change{writes: []write{putRing(m.Overlay, fam, enc), putGranted(m.From, m.ID, p)}})
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
		s.metrics.claimsRefused.WithLabelValues(reasonRecipientQuota).Inc()
		return refuse(reasonRecipientQuota)
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
