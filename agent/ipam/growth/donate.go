package growth

// The donor's side of growth through the ring (the wire format: package
// ipamwire): a space request checked, decided by the overlay table,
// persisted and broadcast before the answer, and the routing of an answer
// to the growth waiting for it; and which block a donor gives. An answer
// carries the donor's ring, merged like any ring gossip (a merge that
// would take addresses in use is refused): only the ring decides what the
// recipient owns.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/carve-net/carve/agent/ipam/ipamwire"
	"github.com/carve-net/carve/agent/ipam/ringgossip"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/gossip"
	"github.com/carve-net/carve/ring"
)

// DonorTable is the overlay table as a donor (the IPAM).
type DonorTable interface {
	// ClusterID is this agent's cluster ("" until it knows it).
	ClusterID() string
	// CheckRequest checks a space request under its sender's claim key,
	// with the reason when it is refused.
	CheckRequest(m ipamwire.SpaceMessage) (reason string, ok bool)
	// Decide decides the answer to a request; persist, when set, returns
	// once the grant is durable, or the error that took it back.
	Decide(m ipamwire.SpaceMessage) (ans ipamwire.SpaceMessage, persist func() error)
	// Granted is told that a grant is durable (the rings are announced).
	Granted()
	// Answer routes a space answer to the growth that asked.
	Answer(src string, m ipamwire.SpaceMessage) error
	// Channel is the ring channel; nil until there is one.
	Channel() gossip.Channel
	// Go is Table.Go.
	Go(f func(ctx context.Context)) error
}

// DonorMetrics are the counters the donor's side counts in.
type DonorMetrics struct {
	RingGossip    *prometheus.CounterVec // by result (ringgossip.Result*)
	ClaimsRefused *prometheus.CounterVec // by reason
	GrantsGiven   prometheus.Counter
}

// Donor answers the space requests of peers.
type Donor struct {
	table   DonorTable
	log     *slog.Logger
	metrics DonorMetrics
	changed func()
}

// NewDonor is the donor's side on table; changed is told of each grant.
func NewDonor(table DonorTable, log *slog.Logger, m DonorMetrics, changed func()) *Donor {
	return &Donor{table: table, log: log, metrics: m, changed: changed}
}

// OnSpaceMessage handles a space request or answer (by unicast).
func (d *Donor) OnSpaceMessage(src string, msg []byte) error {
	m, err := ipamwire.DecodeSpaceMessage(msg)
	if err != nil {
		d.metrics.RingGossip.WithLabelValues(ringgossip.ResultBad).Inc()
		return err
	}
	if m.From != src {
		d.metrics.RingGossip.WithLabelValues(ringgossip.ResultBad).Inc()
		return fmt.Errorf("%w: sent as %q by peer %q", ipamwire.ErrBadSpaceMessage, m.From, src)
	}
	cluster := d.table.ClusterID()
	if cluster != "" && m.ClusterID != cluster {
		d.metrics.RingGossip.WithLabelValues(ringgossip.ResultOtherCluster).Inc()
		return fmt.Errorf("%w: space message of cluster %q, this agent's is %q", ringgossip.ErrOtherCluster, m.ClusterID, cluster)
	}
	if m.Kind == ipamwire.KindRequest {
		reason, ok := d.table.CheckRequest(m)
		if !ok {
			d.metrics.ClaimsRefused.WithLabelValues(reason).Inc()
			return fmt.Errorf("%w: request %q from %s: %s", ipamwire.ErrBadSpaceMessage, m.ID, src, reason)
		}
		if err := d.table.Go(func(ctx context.Context) { d.donate(ctx, m) }); err != nil {
			return fmt.Errorf("request %q from %s: %w", m.ID, src, err) // the asker asks again, or another peer
		}
		return nil
	}
	return d.table.Answer(src, m)
}

// donate answers a space request: a block of the bridges' first
// sub-subnets, as large as asked or smaller, never more than half of what
// is free there, persisted and broadcast before the answer. It runs in a
// goroutine of the table: a table that stopped (ctx ended) decides nothing
// more, and its grant, once persisted, is still answered.
func (d *Donor) donate(ctx context.Context, m ipamwire.SpaceMessage) {
	if ctx.Err() != nil {
		return // stopping: the asker's request times out and goes elsewhere
	}
	ans, persist := d.table.Decide(m)
	if persist != nil {
		if err := persist(); err != nil {
			d.log.Error("persist a grant: not answered", "to", m.From, "err", err)
			return
		}
	}
	if ans.Kind == ipamwire.KindGrant {
		d.metrics.GrantsGiven.Inc()
		d.table.Granted()
		d.changed()
	}
	if ch := d.table.Channel(); ch != nil {
		if err := ch.Unicast(m.From, ipamwire.EncodeSpaceMessage(ans)); err != nil {
			d.log.Warn("answer a space request", "to", m.From, "err", err)
		}
	}
}

// Space is what a donor has to give in an overlay family.
type Space struct {
	Alloc    *ring.Allocator
	Within   []netip.Prefix // the bridges' first sub-subnets
	Free     ring.Uint128   // free addresses in them
	Universe netip.Prefix   // the overlay's subnet of the family
	Info     api.OverlayNetwork
	MinBits  int // the longest prefix a block may have
}

// ChooseBlock donates a block of sp to recipient: as large as bits asks or
// smaller, never more than half of what is free, within the recipient's
// quota; a refusal's reason otherwise.
func ChooseBlock(sp Space, recipient string, bits int) (p netip.Prefix, refusal string) {
	width := sp.Universe.Addr().BitLen()
	room, limited := quotaRoom(sp.Info, sp.Alloc.Ring(), recipient)
	overQuota := false
	for bits := max(bits, sp.Universe.Bits()+1); bits <= sp.MinBits; bits++ {
		log2 := width - bits
		if sp.Free.Rsh(1).Less(ring.U128(1).Lsh(uint(log2))) {
			continue // the donor keeps at least as much as it gives
		}
		if limited && room < 1<<log2 {
			overQuota = true
			continue
		}
		p, err := sp.Alloc.DonateBlock(recipient, sp.Within, log2)
		if errors.Is(err, ring.ErrNothingToDonate) {
			continue
		}
		if err != nil {
			return netip.Prefix{}, "cannot_grant: " + err.Error()
		}
		return p, ""
	}
	if overQuota {
		return netip.Prefix{}, ipamwire.ReasonRecipientQuota
	}
	return netip.Prefix{}, "no_space"
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
