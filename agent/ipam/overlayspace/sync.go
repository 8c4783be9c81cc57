package overlayspace

// How a sync changes an overlay's rings and blocks: its rings seeded from
// everyone's leases, the blocks the masters list learned, its held blocks
// brought in line with the ring. Persistence and gossip sit beneath it: a
// sync returns writes for the group commit, reads the rings on disk
// through RingDisk and tells the gossip what every agent already knows
// through RingKnowledge.

import (
	"log/slog"
	"maps"
	"net/netip"
	"slices"

	"github.com/carve-net/carve/agent/ipam/blockaddr"
	"github.com/carve-net/carve/agent/ipam/claimkeys"
	"github.com/carve-net/carve/agent/ipam/ipamstore"
	"github.com/carve-net/carve/agent/ipam/ipfamily"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
)

// Seed creates (or re-seeds) the allocator of one overlay family from the
// view's leases, and queues its ring's write when it changed. What the
// masters' leases change, every agent changes alike from its own view, so
// it is marked known and never broadcast (that would cost every agent a
// whole ring per registration, cluster-wide); so is the persisted ring
// merged back after a restart, which was announced before (anti-entropy
// repairs what was not). The ring is written at once (ringWrite) only when
// what this agent owns moved; dirty: other agents' entries changed only.
func (o *Overlay) Seed(sy Sync, fam int, peers []Peer, tombstones []api.Tombstone) (ringWrite []ipamstore.Write, dirty bool, err error) {
	u := o.Universe[fam]
	if !u.IsValid() {
		return nil, false, nil
	}
	alloc := o.Alloc[fam]
	fresh := alloc == nil
	var saved []byte
	if fresh && sy.Disk != nil {
		// Read before the allocator exists: a ring that cannot be read
		// leaves the family without one (the next sync reads again),
		// never with a fresh ring that forgot its grants.
		if saved, err = sy.Disk.SavedRing(o.Name, fam); err != nil {
			return nil, false, err
		}
	}
	if fresh {
		if alloc, err = ring.NewAllocator(sy.Self, u); err != nil {
			return nil, false, err
		}
		if sy.Sign != nil {
			alloc.SetSigner(sy.Sign)
		}
		o.Alloc[fam] = alloc
	}
	ownedBefore := alloc.Owned()
	// Each record's blocks are its agent's complete lease set: a newer one
	// replaces the older (a block given back or granted away leaves).
	var sets []ring.LeaseSet
	for _, p := range peers {
		if p.Version == 0 {
			continue
		}
		set := ring.LeaseSet{Owner: p.ID, Version: p.Version}
		for _, sub := range p.Subnets {
			pr, err := netip.ParsePrefix(sub)
			if err == nil && u.Contains(pr.Addr()) && pr.Bits() > u.Bits() {
				set.Prefixes = append(set.Prefixes, pr)
			}
		}
		sets = append(sets, set)
	}
	var leases []ring.Lease
	for _, hb := range o.Blocks[fam] {
		if hb.Origin == OriginGrow && hb.Version > 0 {
			leases = append(leases, ring.Lease{Owner: sy.Self, Prefix: hb.Prefix, Version: hb.Version})
		}
	}
	tombs := make([]ring.Tombstone, 0, len(tombstones))
	for _, t := range tombstones {
		tombs = append(tombs, ring.Tombstone{Owner: t.AgentID, Version: t.Version})
	}
	// The masters' records are the authority: space they take that holds
	// allocations is isolated, never a reason to refuse them (which would
	// stop the whole overlay).
	changed, isolated, err := alloc.SeedSetsIsolating(sets, tombs)
	if err != nil {
		return nil, false, err
	}
	for _, al := range isolated {
		owner, _ := alloc.Ring().Owner(al.Addr)
		sy.Log.Error("the masters' records gave another agent an address this agent's container holds: isolated (the container keeps it, nothing else is handed out there; see carve ipam check)",
			"overlay", o.Name, "address", al.Addr, "container", al.ContainerID, "ifname", al.Interface, "now_leased_to", owner)
	}
	sy.Known.MarkKnown(o, fam, func(k *ring.Ring) error { _, err := k.SeedSets(sets, tombs); return err })
	if len(leases) > 0 {
		more, err := alloc.Seed(leases, nil)
		if err != nil {
			return nil, false, err
		}
		changed = changed || more
		sy.Known.MarkKnown(o, fam, func(k *ring.Ring) error { _, err := k.Seed(leases, nil); return err })
	}
	if saved != nil {
		// Grants made through the ring live only in the ring: merge the
		// persisted one back.
		merged, err := alloc.MergeEncoded(saved)
		if err != nil {
			sy.Log.Warn("persisted ring not merged", "overlay", o.Name, "family", ipfamily.Name(fam), "err", err)
		} else {
			sy.Known.MarkKnown(o, fam, func(k *ring.Ring) error {
				r, err := ring.Decode(saved)
				if err == nil {
					_, err = k.Merge(r)
				}
				return err
			})
		}
		changed = changed || merged
	}
	// Its own tokens signed with a claim key it replaced (a new claim.key)
	// are signed again, once per start: peers verify under its record's
	// key only.
	if fresh && sy.OwnClaim != nil {
		if resigned, err := alloc.Resign(sy.OwnClaim); err != nil {
			sy.Log.Warn("ring claims signed again with the new claim key", "overlay", o.Name, "family", ipfamily.Name(fam), "err", err)
		} else if resigned {
			sy.Log.Info("ring claims signed again with the new claim key", "overlay", o.Name, "family", ipfamily.Name(fam))
			changed = true
		}
	}
	// Tokens others wrote in this agent's leases (a grantee's return the
	// masters recorded since) are outbid by its own, so that no stale
	// grant of its own counts again anywhere (ring.Allocator.Sweep);
	// announced with the sync.
	if swept, err := alloc.Sweep(); err != nil {
		sy.Log.Warn("ring sweep of this agent's leases", "overlay", o.Name, "family", ipfamily.Name(fam), "err", err)
	} else {
		changed = changed || swept
	}
	switch {
	case fresh || !slices.Equal(ownedBefore, alloc.Owned()):
		return []ipamstore.Write{ipamstore.PutRing(o.Name, fam, alloc.EncodeRing())}, false, nil
	case changed:
		// Other agents' leases only: derived again from the masters'
		// records (or the persisted membership) after a restart, and
		// written with the next periodic write, not per registration.
		return nil, true, nil
	}
	return nil, false, nil
}

// LearnMasterBlocks adds the grown blocks the masters' record lists that
// this agent does not hold (after a lost data dir), and returns their
// writes. Not one it gave back (returned, or a grant its ring gives to
// another agent already): until the masters take the return their record
// still lists it, and taking it from there would hand out addresses the
// masters free (a grow block after a restart), or drop it again at once
// (a grant, at every sync while the masters are away). The caller has
// quiesced.
func (o *Overlay) LearnMasterBlocks(self string, blocks []MasterBlock, returned map[netip.Prefix]uint64) (writes []ipamstore.Write) {
	for _, mb := range blocks {
		if mb.Overlay != o.Name || !mb.Prefix.IsValid() {
			continue
		}
		fam := ipfamily.Of(mb.Prefix.Addr())
		if o.Held(fam, mb.Prefix) != nil || mb.Version <= returned[mb.Prefix] {
			continue
		}
		if _, ok := o.Bridges[mb.Bridge]; !ok || !o.Universe[fam].IsValid() {
			continue
		}
		if a := o.Alloc[fam]; a != nil {
			if owner, _ := a.Ring().Owner(blockaddr.Gateway(mb.Prefix)); owner != "" && owner != self {
				continue // given to another agent in the ring (given back)
			}
		}
		if _, inside := blockaddr.OverlapsAny(o.FirstBlocks(fam), mb.Prefix); inside {
			// A block this agent granted and got back, which the masters
			// record as a grant to it: it is part of a first block.
			continue
		}
		hb := &HeldBlock{Overlay: o.Name, Family: fam, Bridge: mb.Bridge, Prefix: mb.Prefix, Origin: OriginGrow, Version: mb.Version, Recorded: true}
		if mb.Donor != "" {
			hb.Origin, hb.Donor, hb.Version = OriginGrant, mb.Donor, 0
		}
		o.Blocks[fam] = append(o.Blocks[fam], hb)
		slices.SortFunc(o.Blocks[fam], func(x, y *HeldBlock) int { return x.Prefix.Addr().Compare(y.Prefix.Addr()) })
		writes = append(writes, PutBlock(hb))
	}
	return writes
}

// SyncBlocks brings the held blocks of a family in line with the ring: a
// range this agent owns outside its own leases and outside the blocks it
// knows is a grant (from an answer, from gossip, or one it held before its
// data dir was lost): it becomes a block of the bridge that asked for space
// (the mesos bridge when none did). A held block whose gateway the ring no
// longer gives this agent is dropped. It returns the writes, and whether
// new blocks were adopted. The caller holds the table's lock.
func (o *Overlay) SyncBlocks(sy Sync, fam int) (writes []ipamstore.Write, adopted bool) {
	a := o.Alloc[fam]
	if a == nil || len(o.Bridges) == 0 {
		return nil, false
	}
	r := a.Ring()
	firsts := o.FirstBlocks(fam)
	var keep []*HeldBlock
	for _, b := range o.Blocks[fam] {
		if first, inside := blockaddr.OverlapsAny(firsts, b.Prefix); inside {
			// A block this agent granted, given back: it is part of
			// the bridge's first sub-subnet again, not a prefix of its own.
			o.UnreserveGateway(fam, b.Prefix)
			sy.Log.Info("a block given back merged into the bridge's first block", "overlay", o.Name, "block", b.Prefix, "into", first)
			writes = append(writes, DeleteBlock(b))
			continue
		}
		if owner, _ := r.Owner(blockaddr.Gateway(b.Prefix)); owner != sy.Self {
			o.UnreserveGateway(fam, b.Prefix)
			sy.Log.Warn("a block is no longer this agent's in the ring: dropped", "overlay", o.Name, "block", b.Prefix, "origin", b.Origin, "owner", owner)
			writes = append(writes, DeleteBlock(b))
			continue
		}
		judged, ok := o.judgeRecorded(sy, fam, b)
		writes = append(writes, judged...)
		if !ok {
			continue // the records took it back (judgeRecorded)
		}
		keep = append(keep, b)
	}
	o.Blocks[fam] = keep
	// What this agent owns inside a bridge's first sub-subnet is that
	// bridge's (a grant given back merges into it), and so is what its
	// leases and held blocks cover.
	covers := slices.Clone(firsts)
	for _, l := range r.Leases() {
		if l.Owner == sy.Self {
			covers = append(covers, l.Prefix)
		}
	}
	for _, b := range o.Blocks[fam] {
		covers = append(covers, b.Prefix)
	}
	bridge := sy.Asking(fam)
	if _, ok := o.Bridges[bridge]; !ok {
		bridge = slices.Sorted(maps.Keys(o.Bridges))[len(o.Bridges)-1] // mesos sorts after docker
	}
	minBits := blockaddr.MinBits(fam)
	for _, owned := range r.Blocks(sy.Self) {
		for _, p := range blockaddr.Uncovered(owned, covers) {
			if p.Bits() > minBits {
				continue // too small to hold a gateway and a container
			}
			if why, ok := mayAdopt(sy, p); !ok {
				if sy.Growing != nil && sy.Growing(fam) {
					continue // perhaps the grant asked for, its answer on the way
				}
				if o.Unsolicited == nil {
					o.Unsolicited = map[netip.Prefix]bool{}
				}
				if !o.Unsolicited[p] {
					o.Unsolicited[p] = true
					sy.Refused(claimkeys.ReasonUnsolicitedGrant)
					sy.Log.Warn("the ring gives this agent a range it did not ask for: not used", "overlay", o.Name, "block", p,
						"granted_by", blockaddr.LeaseOwner(r, sy.Self, p), "why", why)
				}
				continue
			}
			b := &HeldBlock{Overlay: o.Name, Family: fam, Bridge: bridge, Prefix: p, Origin: OriginGrant, Donor: blockaddr.LeaseOwner(r, sy.Self, p),
				Recorded: sy.Recorded != nil && sy.Recorded(p)}
			o.Blocks[fam] = append(o.Blocks[fam], b)
			writes = append(writes, PutBlock(b))
			adopted = true
			sy.Log.Info("block granted through the ring", "overlay", o.Name, "bridge", bridge, "block", p, "donor", b.Donor)
		}
	}
	slices.SortFunc(o.Blocks[fam], func(x, y *HeldBlock) int { return x.Prefix.Addr().Compare(y.Prefix.Addr()) })
	o.ReserveGateways()
	return writes, adopted
}

// mayAdopt is the one rule of what space beyond the masters' records an
// agent uses (docs/design.md, "The space an agent allocates in"): the
// masters' signed records give it its lease, its grown blocks and the
// grants they recorded (LearnMasterBlocks brings those in); beyond them
// only a grant it asked for itself, with the donor's verified statement in
// hand (agent/ipam's acceptAnswer), the one exception that lets growth work while the
// masters are unreachable. A recorded block the ring gives this agent only
// later (its data dir was lost; the donor's ring comes by gossip) is
// adopted then. What any other host writes in the ring, even
// its own signed word in its own space, may show this agent as the owner
// of a range; it never makes it place a container there.
func mayAdopt(sy Sync, p netip.Prefix) (why string, ok bool) {
	if sy.Expected != nil && sy.Expected(p) {
		return "", true
	}
	return "neither the masters' records nor a grant this agent asked for give it the range", false
}

// RingDisk is the persistence beneath an overlay's sync: its rings as
// last written.
type RingDisk interface {
	SavedRing(overlay string, fam int) ([]byte, error)
}

// RingKnowledge is the gossip beneath an overlay's sync: what every agent
// already holds of a ring (the masters' leases, a ring read back), which
// is never broadcast.
type RingKnowledge interface {
	MarkKnown(o *Overlay, fam int, f func(known *ring.Ring) error)
}

// Sync is what a sync of an overlay reaches beneath it.
type Sync struct {
	Self string
	// Sign signs the claims of the allocators it makes (nil: unsigned);
	// OwnClaim tells whether one of its claims verifies under its
	// current claim key (nil: no key).
	Sign     func(msg []byte) []byte
	OwnClaim func(ring.Claim) bool
	Disk     RingDisk // nil: the rings on disk are another cluster's, never read
	Known    RingKnowledge
	// Asking is the bridge a family asks space for now (a range the ring
	// gives this agent beyond what it holds becomes that bridge's).
	Asking func(fam int) string
	// Expected tells whether p is (inside) a grant this agent asked for
	// and holds the donor's verified statement of (mayAdopt).
	Expected func(p netip.Prefix) bool
	// Recorded tells whether the masters' record of this agent lists a
	// grown or granted block holding p; nil while the view has no record
	// of it (judgeRecorded judges nothing then).
	Recorded func(p netip.Prefix) bool
	// Refused counts a range not adopted, by reason; Growing tells whether
	// a growth of the family is in flight (its answer's ring may come by
	// gossip before the answer: not yet a refusal).
	Refused func(reason string)
	Growing func(fam int) bool
	Log     *slog.Logger
}
