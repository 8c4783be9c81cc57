package overlayspace

// The masters' records as the authority over the blocks an agent holds,
// not only over those it adopts (docs/design.md, "The space an agent
// allocates in"): a block the records listed and list no more (a restore
// of their table) is dropped, whatever the ring shows, and the addresses
// handed out there are isolated: kept, counted, never handed out again.

import (
	"net/netip"
	"slices"

	"github.com/carve-net/carve/agent/ipam/ipamstore"

	"github.com/carve-net/carve/ring"
)

// judgeRecorded applies the masters' record of this agent to a held block
// of family fam: the first record that lists it marks it Recorded; a
// record that no longer lists a Recorded block takes it back. keep is
// false when the block is dropped; writes persist the change. The caller
// holds the table's lock.
//
// Why the ring alone does not do it: a restore gives the donor of a
// recorded grant its space back at the restore's index, and a claim
// counts wherever its writer leases, whatever its version. A ring grant
// of a larger range the donor wrote before (unasked, so never adopted: a
// rogue's), which the recorded block's own lease shadowed, then counts
// again over the block: the ring still gives it to this agent, and it
// would go on handing out addresses there that the records give the donor.
func (o *Overlay) judgeRecorded(sy Sync, fam int, b *HeldBlock) (writes []ipamstore.Write, keep bool) {
	if sy.Recorded == nil {
		return nil, true // no record of this agent yet: nothing to judge by
	}
	switch listed := sy.Recorded(b.Prefix); {
	case listed && !b.Recorded:
		b.Recorded = true
		return []ipamstore.Write{PutBlock(b)}, true
	case listed || !b.Recorded:
		// Listed; or not recorded yet (a grant whose report is on its
		// way, a grow the watch has not brought): the ring's word.
		return nil, true
	}
	o.UnreserveGateway(fam, b.Prefix)
	held := o.attachedIn(fam, b.Prefix)
	sy.Log.Error("the masters' records no longer give this agent a block it held (their table was restored): dropped, whatever the ring shows; nothing more is handed out there, its containers keep their addresses, isolated (see carve ipam check)",
		"overlay", o.Name, "block", b.Prefix, "origin", b.Origin, "donor", b.Donor, "isolated", len(held))
	for _, al := range held {
		sy.Log.Error("the masters' records took back the block of an address this agent's container holds: isolated (the container keeps it, nothing else is handed out there; see carve ipam check)",
			"overlay", o.Name, "address", al.addr, "block", b.Prefix, "container", al.at.ContainerID, "ifname", al.at.Interface)
	}
	return []ipamstore.Write{DeleteBlock(b)}, false
}

// attachedAddr is one address of an attachment.
type attachedAddr struct {
	at   ring.Attachment
	addr netip.Addr
}

// attachedIn lists the addresses of family fam that the overlay's
// attachments hold inside p, in address order.
func (o *Overlay) attachedIn(fam int, p netip.Prefix) []attachedAddr {
	var out []attachedAddr
	for at, rec := range o.Attached {
		if addr := rec.Addr(fam); addr.IsValid() && p.Contains(addr) {
			out = append(out, attachedAddr{at, addr})
		}
	}
	slices.SortFunc(out, func(x, y attachedAddr) int { return x.addr.Compare(y.addr) })
	return out
}

// IsolatedCount counts the addresses of this agent's containers that the
// masters' records do not give it: those the ring isolated (the records
// leased their range to another agent), and those outside both the
// record's blocks (own, this agent's complete lease set in the records)
// and the blocks it holds (a block the records took back while the ring
// still shows it as this agent's). Without a record, only the first.
func (o *Overlay) IsolatedCount(own []netip.Prefix) int {
	n := 0
	for fam := range families {
		a := o.Alloc[fam]
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
		for _, b := range o.Blocks[fam] {
			given = append(given, b.Prefix)
		}
		for _, rec := range o.Attached {
			addr := rec.Addr(fam)
			if addr.IsValid() && !isolated[addr] && !slices.ContainsFunc(given, func(p netip.Prefix) bool { return p.Contains(addr) }) {
				n++
			}
		}
	}
	return n
}
