package state

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/logcmd"
	"github.com/carve-net/carve/prefixspace"
)

// Errors of the growth commands; the HTTP layer maps them to codes.
var (
	// ErrOverlayExhausted: no free block of the asked size is left (409 exhausted).
	ErrOverlayExhausted = errors.New("exhausted")
	// ErrBlockConflict: the prefix is not the caller's to give, or is
	// someone else's (409 conflict).
	ErrBlockConflict = errors.New("block conflict")
	// ErrInvalidBlock: the request names no block it could act on (400).
	ErrInvalidBlock = errors.New("invalid block request")
)

// sortBlocks puts blocks in api.SortBlocks order (the signed order).
func sortBlocks(bs []leaseBlock) {
	slices.SortFunc(bs, func(x, y leaseBlock) int {
		if c := strings.Compare(x.Bridge, y.Bridge); c != 0 {
			return c
		}
		if c := strings.Compare(x.Prefix.String(), y.Prefix.String()); c != 0 {
			return c
		}
		if c := strings.Compare(x.Origin, y.Origin); c != 0 {
			return c
		}
		return strings.Compare(x.Donor, y.Donor)
	})
}

// takeLeaseBlocks marks a new subnet held by id and returns blocks with its
// halves added as the lease blocks of the mesos and docker bridges (both,
// whether or not the agent runs the bridge: the space is its own either way).
func (t *LeaseTable) takeLeaseBlocks(space *blockSpace, id string, blocks []leaseBlock, subnet netip.Prefix, index uint64) []leaseBlock {
	m, d := prefixspace.Halves(subnet)
	out := slices.Clone(blocks)
	for _, b := range []leaseBlock{
		{Bridge: api.BridgeMesos, Prefix: m, Origin: api.BlockLeased, Home: m, Version: index},
		{Bridge: api.BridgeDocker, Prefix: d, Origin: api.BlockLeased, Home: d, Version: index},
	} {
		_ = space.Add(b.Prefix, agentHolds(id)) // a free slice: cannot overlap
		out = append(out, b)
	}
	sortBlocks(out)
	return out
}

// reclaimOwnSlice gives an agent that registers again under the id of a
// deleted one the first prefix-sized slice of its own quarantined space
// that nothing else holds: the quarantine guards against grants the
// deleted agent made that the masters have not heard of, and the agent
// itself (its ring, persisted with its id) knows them. The slice leaves
// the quarantine and is free for the caller to take; nothing changes when
// there is none.
func (t *LeaseTable) reclaimOwnSlice(overlay string, space *blockSpace, id string, bits int) (netip.Prefix, bool) {
	if space == nil {
		return netip.Prefix{}, false
	}
	for _, q := range t.quarantine[overlay] {
		if q.From != id || q.Prefix.Addr().Is4() != space.Universe().Addr().Is4() || q.Prefix.Bits() < bits {
			continue
		}
		slice := netip.PrefixFrom(q.Prefix.Addr(), bits).Masked()
		if _, ok := space.Span(slice); !ok {
			continue
		}
		own := true
		for _, h := range space.Overlapping(slice) {
			own = own && h.Holder == quarantineHolds(id) && prefixspace.Contains(slice, h.Prefix)
		}
		if !own || !space.Covers(slice) {
			continue
		}
		var keep []quarantined
		for _, o := range t.quarantine[overlay] {
			if o.From == id && slice.Contains(o.Prefix.Addr()) && o.Prefix.Bits() >= bits {
				space.Remove(o.Prefix)
				continue
			}
			keep = append(keep, o)
		}
		t.quarantine[overlay] = keep
		return slice, true
	}
	return netip.Prefix{}, false
}

// reclaimOwnQuarantine gives an agent registered again under a deleted
// id every block of its own quarantined space that is left in an overlay
// (after its first slice, see reclaimOwnSlice), as grown blocks of the
// bridge they served: its containers may hold addresses there, and its
// ring, persisted with its id, knows the grants it made from them (a grant
// reported late already moved its part out of the quarantine).
// Only in a family where it was leased a subnet: an agent without one
// serves nothing there, and its quarantine waits for the usual release.
func (t *LeaseTable) reclaimOwnQuarantine(rec *agentRecord, def overlayDef, l overlayLease, index uint64) overlayLease {
	overlay := def.Name()
	var keep []quarantined
	for _, q := range t.quarantine[overlay] {
		space := t.spaces[overlay].family(q.Prefix.Addr().Is4())
		leased := l.Subnet.IsValid()
		if q.Prefix.Addr().Is6() {
			leased = l.Subnet6.IsValid()
		}
		if q.From != rec.ID || space == nil || !leased {
			keep = append(keep, q)
			continue
		}
		space.Remove(q.Prefix)
		_ = space.Add(q.Prefix, agentHolds(rec.ID)) // its own quarantine: nobody else holds it
		bridge := q.Bridge
		if bridge == "" {
			bridge = api.BridgeMesos
		}
		l.Blocks = append(l.Blocks, leaseBlock{Bridge: bridge, Prefix: q.Prefix, Origin: api.BlockGrown, Home: q.Prefix, Version: index,
			Epoch: t.restore.RestoreEpoch()})
	}
	if len(keep) != len(t.quarantine[overlay]) {
		t.quarantine[overlay] = keep
		sortBlocks(l.Blocks)
	}
	return l
}

// legacyLeaseBlocks gives a record restored from a format without blocks
// the lease blocks of its subnets.
func legacyLeaseBlocks(rec *agentRecord) {
	for name, l := range rec.Leases {
		if len(l.Blocks) > 0 {
			continue
		}
		for _, s := range []netip.Prefix{l.Subnet, l.Subnet6} {
			if !s.IsValid() {
				continue
			}
			m, d := prefixspace.Halves(s)
			l.Blocks = append(l.Blocks,
				leaseBlock{Bridge: api.BridgeMesos, Prefix: m, Origin: api.BlockLeased, Home: m, Version: rec.Version},
				leaseBlock{Bridge: api.BridgeDocker, Prefix: d, Origin: api.BlockLeased, Home: d, Version: rec.Version})
		}
		sortBlocks(l.Blocks)
		rec.Leases[name] = l
	}
}

// setBlocks replaces the blocks of one overlay of rec (a fresh clone, not
// yet stored) and updates the allocators: what it no longer holds is freed,
// what it holds anew is taken. The caller has checked that the new blocks
// overlap nothing but the space it frees.
func (t *LeaseTable) setBlocks(rec *agentRecord, overlay string, blocks []leaseBlock) error {
	l := rec.Leases[overlay]
	sp := t.spaces[overlay]
	sortBlocks(blocks)
	for _, b := range l.Blocks {
		if !slices.Contains(blocks, b) {
			if space := sp.family(b.Prefix.Addr().Is4()); space != nil {
				space.RemoveHeld(b.Prefix, agentHolds(rec.ID))
			}
		}
	}
	for _, b := range blocks {
		if !slices.ContainsFunc(l.Blocks, func(o leaseBlock) bool { return o.Prefix == b.Prefix }) {
			space := sp.family(b.Prefix.Addr().Is4())
			if space == nil {
				return fmt.Errorf("%w: overlay %q has no space for %s", ErrInvalidBlock, overlay, b.Prefix)
			}
			if err := space.Add(b.Prefix, agentHolds(rec.ID)); err != nil {
				return fmt.Errorf("%w: %v", ErrBlockConflict, err)
			}
		}
	}
	l.Blocks = blocks
	rec.Leases[overlay] = l
	return nil
}

// coalesce merges buddy pieces of one home block (same bridge, origin,
// donor and home) back into their parent, so that a granted-away part that
// comes back makes the block whole again.
func coalesce(bs []leaseBlock) []leaseBlock {
	for {
		merged := false
		for i := 0; i < len(bs) && !merged; i++ {
			x := bs[i]
			if x.Prefix.Bits() <= x.Home.Bits() {
				continue
			}
			sib := prefixspace.Sibling(x.Prefix)
			for j := range bs {
				y := bs[j]
				if j == i || y.Prefix != sib || y.Bridge != x.Bridge || y.Origin != x.Origin || y.Donor != x.Donor || y.Home != x.Home {
					continue
				}
				p := x
				p.Prefix, p.Version = prefixspace.Parent(x.Prefix), max(x.Version, y.Version)
				out := make([]leaseBlock, 0, len(bs)-1)
				for k, b := range bs {
					if k != i && k != j {
						out = append(out, b)
					}
				}
				bs = append(out, p)
				merged = true
				break
			}
		}
		if !merged {
			sortBlocks(bs)
			return bs
		}
	}
}

// applyGrow leases one more block, first fit, of the overlay's grow size.
func (t *LeaseTable) applyGrow(index uint64, c *logcmd.Grow) (*agentRecord, error) {
	if t.net == nil {
		return nil, ErrNoConfig
	}
	old := t.agents[c.AgentID]
	if old == nil {
		return nil, fmt.Errorf("%w %q", ErrUnknownAgent, c.AgentID)
	}
	def, ok := t.net.Overlay(c.Overlay)
	if !ok {
		return nil, fmt.Errorf("%w: overlay %q is not configured", ErrInvalidBlock, c.Overlay)
	}
	if !def.Enabled() {
		return nil, fmt.Errorf("%w: overlay %q is disabled", ErrInvalidBlock, c.Overlay)
	}
	space := t.spaces[c.Overlay].family(c.Family == 4)
	if space == nil {
		return nil, fmt.Errorf("%w: overlay %q has no IPv%d subnet", ErrInvalidBlock, c.Overlay, c.Family)
	}
	bits := def.GrowBits(c.Family == 4)
	p, ok := space.FirstFree(bits)
	if !ok {
		return nil, fmt.Errorf("%w: no free /%d left in overlay %q (%s)", ErrOverlayExhausted, bits, c.Overlay, space.Universe())
	}
	if err := checkQuota(def, c.AgentID, old.Leases[c.Overlay].Blocks, p); err != nil {
		return nil, err
	}
	rec := old.Clone()
	blocks := append(slices.Clone(rec.Leases[c.Overlay].Blocks),
		leaseBlock{Bridge: c.Bridge, Prefix: p, Origin: api.BlockGrown, Home: p, Version: index, Epoch: t.restore.RestoreEpoch()})
	if err := t.setBlocks(rec, c.Overlay, blocks); err != nil {
		return nil, err
	}
	t.store(index, rec)
	return rec, nil
}

// store commits a changed record at index.
func (t *LeaseTable) store(index uint64, rec *agentRecord) {
	rec.Version = index
	t.agents[rec.ID] = rec
	t.stateIndex = index
	t.touch(rec.ID)
}

// staleReturn refuses a return decided before a restore of the table when
// what the agent holds inside its prefix was leased after that restore:
// the restore took back the lease the return was decided on, and the
// return waited (the agent's outbox, the masters down) while the agent was
// leased the block anew. Freeing it now would free space the agent
// allocates in. A block carries the restore epoch it was leased in
// (record.Block.Epoch), and the return the epoch of the record it was
// decided on: versions cannot tell a kept block from a later lease (a
// whole-cluster restore starts a log whose indexes repeat the old one's,
// and changes that are not leases re-version a block). Within one epoch
// the masters never lease a block its returner still holds. A return that
// names no version is of an agent of an earlier release, judged as before.
func (t *LeaseTable) staleReturn(c *logcmd.Return, give []leaseBlock) error {
	if c.Version == 0 {
		return nil
	}
	for _, b := range give {
		if b.Epoch > c.RestoreEpoch {
			return fmt.Errorf("%w: agent %q decided this return of %s in overlay %q in restore epoch %d, and was leased %s again since, in epoch %d (version %d): the return is stale and the block stays the agent's",
				ErrBlockConflict, c.AgentID, c.Prefix, c.Overlay, c.RestoreEpoch, b.Prefix, b.Epoch, b.Version)
		}
	}
	return nil
}

// applyReturn gives back what an agent holds inside a prefix: a grown block
// to the free space; a granted one to its donor when the donor still holds
// pieces of the block it was cut from, else to the free space. A first
// lease block cannot be returned.
func (t *LeaseTable) applyReturn(index uint64, c *logcmd.Return) (*agentRecord, error) {
	if t.net == nil {
		return nil, ErrNoConfig
	}
	old := t.agents[c.AgentID]
	if old == nil {
		return nil, fmt.Errorf("%w %q", ErrUnknownAgent, c.AgentID)
	}
	if t.spaces[c.Overlay].family(c.Prefix.Addr().Is4()) == nil {
		return nil, fmt.Errorf("%w: overlay %q has no space for %s", ErrInvalidBlock, c.Overlay, c.Prefix)
	}
	var keep, give []leaseBlock
	for _, b := range old.Leases[c.Overlay].Blocks {
		switch {
		case !b.Prefix.Overlaps(c.Prefix):
			keep = append(keep, b)
		case b.Origin == api.BlockLeased:
			return nil, fmt.Errorf("%w: %s is part of agent %q's first lease (%s), which is returned only by deleting the agent", ErrInvalidBlock, c.Prefix, c.AgentID, b.Prefix)
		case b.Prefix.Bits() >= c.Prefix.Bits():
			give = append(give, b)
		default: // the prefix is inside the block: keep the rest of it
			for _, r := range prefixspace.Subtract(b.Prefix, c.Prefix) {
				piece := b
				piece.Prefix = r
				keep = append(keep, piece)
			}
			piece := b
			piece.Prefix = c.Prefix
			give = append(give, piece)
		}
	}
	if len(give) == 0 {
		return nil, fmt.Errorf("%w: agent %q holds nothing inside %s in overlay %q", ErrBlockConflict, c.AgentID, c.Prefix, c.Overlay)
	}
	if err := t.staleReturn(c, give); err != nil {
		return nil, err
	}
	rec := old.Clone()
	if err := t.setBlocks(rec, c.Overlay, keep); err != nil {
		return nil, err
	}
	// Donors take back their parts after the returner let go of them.
	donors := map[string][]leaseBlock{}
	for _, b := range give {
		if b.Origin != api.BlockGranted || b.Donor == "" || b.Donor == c.AgentID {
			continue
		}
		d := t.agents[b.Donor]
		if d == nil {
			continue
		}
		blocks, ok := donors[b.Donor]
		if !ok {
			blocks = slices.Clone(d.Leases[c.Overlay].Blocks)
		}
		for _, h := range blocks {
			if h.Home.Contains(b.Prefix.Addr()) && h.Home.Bits() <= b.Prefix.Bits() {
				back := h
				back.Prefix, back.Version = b.Prefix, index
				blocks = coalesce(append(blocks, back))
				donors[b.Donor] = blocks
				break
			}
		}
	}
	t.store(index, rec)
	for _, id := range slices.Sorted(maps.Keys(donors)) {
		d := t.agents[id].Clone()
		if err := t.setBlocks(d, c.Overlay, donors[id]); err != nil {
			return nil, err // cannot happen: the returner freed that space
		}
		t.store(index, d)
	}
	return rec, nil
}

// applyGrant records a ring grant of c.Prefix from c.Donor to c.Recipient.
// The prefix must lie inside the donor's holdings at the masters (its
// blocks, or its quarantined space when it was deleted since) or inside
// the recipient's; nothing of it may be another agent's. A grant already
// recorded changes nothing.
func (t *LeaseTable) applyGrant(index uint64, c *logcmd.Grant) (*agentRecord, error) {
	if t.net == nil {
		return nil, ErrNoConfig
	}
	if c.Donor == c.Recipient {
		return nil, fmt.Errorf("%w: donor and recipient are both %q", ErrInvalidBlock, c.Donor)
	}
	recip := t.agents[c.Recipient]
	if recip == nil {
		return nil, fmt.Errorf("%w: recipient %q", ErrUnknownAgent, c.Recipient)
	}
	donor := t.agents[c.Donor]
	if _, gone := t.tombstones[c.Donor]; donor == nil && !gone {
		return nil, fmt.Errorf("%w: donor %q", ErrUnknownAgent, c.Donor)
	}
	space := t.spaces[c.Overlay].family(c.Prefix.Addr().Is4())
	if space == nil {
		return nil, fmt.Errorf("%w: overlay %q has no space for %s", ErrInvalidBlock, c.Overlay, c.Prefix)
	}
	if _, ok := space.Span(c.Prefix); !ok {
		return nil, fmt.Errorf("%w: %s is not inside overlay %q (%s)", ErrInvalidBlock, c.Prefix, c.Overlay, space.Universe())
	}
	for _, b := range recip.Leases[c.Overlay].Blocks {
		if b.Prefix.Contains(c.Prefix.Addr()) && b.Prefix.Bits() <= c.Prefix.Bits() {
			return recip, nil // already the recipient's
		}
	}
	if _, used := t.usedStatements[c.Statement]; c.Statement != "" && used {
		return nil, fmt.Errorf("%w: %q's statement granting %s to %q moved it once already (the block went back since); a recipient asks its donor again for space it needs",
			ErrStatementUsed, c.Donor, c.Prefix, c.Recipient)
	}
	covered := true
	for _, h := range space.Overlapping(c.Prefix) {
		switch {
		case h.Holder.id == c.Donor && (h.Holder.quarantined || donor != nil):
		case h.Holder == agentHolds(c.Recipient):
		default:
			return nil, fmt.Errorf("%w: grant of %s from %q to %q: it overlaps %s of %s", ErrBlockConflict, c.Prefix, c.Donor, c.Recipient, h.Prefix, h.Holder)
		}
	}
	if donor != nil {
		covered = space.Covers(c.Prefix)
	}
	if !covered {
		return nil, fmt.Errorf("%w: grant of %s from %q to %q: it is not inside the donor's holdings at the masters (part of it is free space)", ErrBlockConflict, c.Prefix, c.Donor, c.Recipient)
	}
	if err := t.grantWithinQuota(c, recip); err != nil {
		return nil, err
	}
	// The donor lets go of the prefix.
	if donor != nil {
		var blocks []leaseBlock
		for _, b := range donor.Leases[c.Overlay].Blocks {
			blocks = append(blocks, cutOut(b, c.Prefix)...)
		}
		if !slices.Equal(blocks, donor.Leases[c.Overlay].Blocks) {
			d := donor.Clone()
			if err := t.setBlocks(d, c.Overlay, blocks); err != nil {
				return nil, err
			}
			t.store(index, d)
		}
	}
	var qs []quarantined
	for _, q := range t.quarantine[c.Overlay] {
		if q.From != c.Donor || !q.Prefix.Overlaps(c.Prefix) {
			qs = append(qs, q)
			continue
		}
		space.Remove(q.Prefix)
		for _, r := range cutOut(leaseBlock{Prefix: q.Prefix}, c.Prefix) {
			_ = space.Add(r.Prefix, quarantineHolds(q.From)) // the rest of what was just freed
			qs = append(qs, quarantined{Prefix: r.Prefix, From: q.From, Since: q.Since, Bridge: q.Bridge, ClaimKey: q.ClaimKey})
		}
	}
	t.quarantine[c.Overlay] = qs
	rec := recip.Clone()
	var blocks []leaseBlock
	for _, b := range rec.Leases[c.Overlay].Blocks {
		if !b.Prefix.Overlaps(c.Prefix) {
			blocks = append(blocks, b)
		}
	}
	bridge := c.Bridge
	if bridge == "" {
		bridge = api.BridgeMesos
	}
	blocks = append(blocks, leaseBlock{Bridge: bridge, Prefix: c.Prefix, Origin: api.BlockGranted, Donor: c.Donor, Home: c.Prefix, Version: index,
		Epoch: t.restore.RestoreEpoch()})
	if err := t.setBlocks(rec, c.Overlay, blocks); err != nil {
		return nil, err
	}
	if c.Statement != "" {
		t.usedStatements[c.Statement] = c.Expires
	}
	t.store(index, rec)
	return rec, nil
}

// cutOut returns b without the part inside p: b itself when they do not
// overlap, nothing when b is inside p, else the decomposition of the rest.
func cutOut(b leaseBlock, p netip.Prefix) []leaseBlock {
	var out []leaseBlock
	for _, r := range prefixspace.CutOut(b.Prefix, p) {
		piece := b
		piece.Prefix = r
		out = append(out, piece)
	}
	return out
}

// applyRelease frees the quarantined blocks that every live agent's
// acknowledgement covers: those of agents deleted at or before the lowest
// acknowledged index. An agent without a valid acknowledgement (none, or
// one of an earlier record of its id) holds everything back.
func (t *LeaseTable) applyRelease(index uint64, c *logcmd.Release) int {
	floor := ^uint64(0)
	for id, rec := range t.agents {
		a, ok := c.Acks[id]
		if !ok || a.Created != rec.Created {
			return 0
		}
		floor = min(floor, a.Index)
	}
	n := t.releaseQuarantine(func(q quarantined) bool { return q.Since <= floor })
	if n > 0 {
		t.stateIndex = index
	}
	return n
}

// releaseQuarantine frees the quarantined blocks that match and returns
// how many it freed.
func (t *LeaseTable) releaseQuarantine(match func(quarantined) bool) int {
	n := 0
	for _, name := range slices.Sorted(maps.Keys(t.quarantine)) {
		var keep []quarantined
		for _, q := range t.quarantine[name] {
			if !match(q) {
				keep = append(keep, q)
				continue
			}
			if space := t.spaces[name].family(q.Prefix.Addr().Is4()); space != nil {
				space.Remove(q.Prefix)
			}
			n++
		}
		if len(keep) == 0 {
			delete(t.quarantine, name)
		} else {
			t.quarantine[name] = keep
		}
	}
	return n
}
