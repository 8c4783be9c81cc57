package ipam

// The masters' records as the authority over the blocks an agent holds,
// not only over those it adopts (docs/design.md, "The space an agent
// allocates in"): a block the records listed and list no more (a restore
// of their table) is dropped, whatever the ring shows, and the addresses
// handed out there are isolated: kept, counted, never handed out again.

import (
	"net/netip"
	"slices"

	"github.com/carve-net/carve/ring"
)

// judgeRecorded applies the masters' record of this agent to a held block
// of family fam: the first record that lists it marks it Recorded; a
// record that no longer lists a Recorded block takes it back. keep is
// false when the block is dropped; writes persist the change. The caller
// holds s.mu.
//
// Why the ring alone does not do it: a restore gives the donor of a
// recorded grant its space back at the restore's index, and a claim
// counts wherever its writer leases, whatever its version. A ring grant
// of a larger range the donor wrote before (unasked, so never adopted: a
// rogue's), which the recorded block's own lease shadowed, then counts
// again over the block: the ring still gives it to this agent, and it
// would go on handing out addresses there that the records give the donor.
func (o *overlay) judgeRecorded(sy overlaySync, fam int, b *heldBlock) (writes []write, keep bool) {
	if sy.recorded == nil {
		return nil, true // no record of this agent yet: nothing to judge by
	}
	switch listed := sy.recorded(b.Prefix); {
	case listed && !b.Recorded:
		b.Recorded = true
		return []write{putBlock(b)}, true
	case listed || !b.Recorded:
		// Listed; or not recorded yet (a grant whose report is on its
		// way, a grow the watch has not brought): the ring's word.
		return nil, true
	}
	o.unreserveGateway(fam, b.Prefix)
	held := o.attachedIn(fam, b.Prefix)
	sy.log.Error("the masters' records no longer give this agent a block it held (their table was restored): dropped, whatever the ring shows; nothing more is handed out there, its containers keep their addresses, isolated (see carve ipam check)",
		"overlay", o.name, "block", b.Prefix, "origin", b.Origin, "donor", b.Donor, "isolated", len(held))
	for _, al := range held {
		sy.log.Error("the masters' records took back the block of an address this agent's container holds: isolated (the container keeps it, nothing else is handed out there; see carve ipam check)",
			"overlay", o.name, "address", al.addr, "block", b.Prefix, "container", al.at.ContainerID, "ifname", al.at.Interface)
	}
	return []write{deleteBlock(b)}, false
}

// attachedAddr is one address of an attachment.
type attachedAddr struct {
	at   ring.Attachment
	addr netip.Addr
}

// attachedIn lists the addresses of family fam that the overlay's
// attachments hold inside p, in address order.
func (o *overlay) attachedIn(fam int, p netip.Prefix) []attachedAddr {
	var out []attachedAddr
	for at, rec := range o.attached {
		if addr := rec.addr(fam); addr.IsValid() && p.Contains(addr) {
			out = append(out, attachedAddr{at, addr})
		}
	}
	slices.SortFunc(out, func(x, y attachedAddr) int { return x.addr.Compare(y.addr) })
	return out
}

// isolatedCount counts the addresses of this agent's containers that the
// masters' records do not give it: those the ring isolated (the records
// leased their range to another agent), and those outside both the
// record's blocks (own, this agent's complete lease set in the records)
// and the blocks it holds (a block the records took back while the ring
// still shows it as this agent's). Without a record, only the first.
func (o *overlay) isolatedCount(own []netip.Prefix) int {
	n := 0
	for fam := range families {
		a := o.alloc[fam]
		if a == nil {
			continue
		}
		isolated := map[netip.Addr]bool{}
		for _, al := range a.Isolated() {
			isolated[al.Addr] = true
		}
		n += len(isolated)
		if len(own) == 0 {
			continue
		}
		given := slices.Clone(own)
		for _, b := range o.blocks[fam] {
			given = append(given, b.Prefix)
		}
		for _, rec := range o.attached {
			addr := rec.addr(fam)
			if addr.IsValid() && !isolated[addr] && !slices.ContainsFunc(given, func(p netip.Prefix) bool { return p.Contains(addr) }) {
				n++
			}
		}
	}
	return n
}

// ownRecordBlocks is this agent's complete lease set in the view (every
// block its record lists, in every overlay and family).
func ownRecordBlocks(v View, self string) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range v.Peers {
		if p.ID != self {
			continue
		}
		for _, s := range p.Subnets {
			if pr, err := netip.ParsePrefix(s); err == nil {
				out = append(out, pr)
			}
		}
	}
	return out
}
