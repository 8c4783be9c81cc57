package ipam

// How a sync changes an overlay: the masters' view applied to it (its
// subnets, bridges, the blocks the masters list), its rings seeded from
// everyone's leases, its held blocks brought in line with the ring, and
// its persisted allocations claimed back. Persistence and gossip sit
// beneath it: a sync returns writes for the group commit, reads the rings
// on disk through ringDisk and tells the gossip what every agent already
// knows through ringKnowledge.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"

	"github.com/carve-net/carve/agent/ipam/blockaddr"
	"github.com/carve-net/carve/agent/ipam/ipfamily"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
)

// syncOverlays applies the view's overlays; the caller has quiesced.
func (s *Service) syncOverlays(v View, b *batch) {
	seen := map[string]bool{}
	if v.Self != nil {
		for i := range v.Self.Overlays {
			ov := &v.Self.Overlays[i]
			seen[ov.Info.Name] = true
			s.syncOverlay(ov, v, b)
		}
	}
	for _, name := range sortedKeys(s.overlays) {
		if o := s.overlays[name]; !seen[name] {
			why := fmt.Sprintf("overlay %q is no longer leased to this agent", name)
			if v.Self == nil {
				why = "this agent has no lease (not registered with a master)"
			}
			o.disabled = false
			s.stopServing(o, why)
		}
	}
}

// syncOverlay applies one overlay of the agent's record. It serves an
// overlay that is leased (in the record, with a subnet), whatever status
// the record shows: that status is what this agent reported to the masters,
// and acting on it would make an agent that reported a failure stop serving.
func (s *Service) syncOverlay(ov *api.AgentOverlay, v View, b *batch) {
	name := ov.Info.Name
	o := s.overlays[name]
	if ov.Subnet == "" && ov.Subnet6 == "" {
		if o != nil {
			s.stopServing(o, statusMessage(ov))
		}
		return
	}
	var universe [families]netip.Prefix
	var parseErrs []error
	for fam, sub := range []string{ov.Info.Subnet, ov.Info.Subnet6} {
		if sub == "" {
			continue
		}
		p, err := netip.ParsePrefix(sub)
		if err != nil {
			parseErrs = append(parseErrs, fmt.Errorf("overlay subnet %q: %w", sub, err))
			continue
		}
		universe[fam] = p
	}
	if o != nil && o.universe != universe {
		s.log.Warn("the overlay's subnets changed: its rings start over", "overlay", name, "was", o.universe, "now", universe)
		s.retire(o)
		o = nil
	}
	created := o == nil
	if created {
		o = &overlay{name: name, universe: universe, attached: map[ring.Attachment]allocRecord{}, gateways: map[netip.Addr]bool{}}
		for _, b := range s.savedBlocks[name] {
			if universe[b.Family].IsValid() && universe[b.Family].Contains(b.Prefix.Addr()) {
				o.blocks[b.Family] = append(o.blocks[b.Family], b)
			}
		}
		delete(s.savedBlocks, name)
		s.overlays[name] = o
	} else if o.unserved != "" && ov.Info.IsEnabled() {
		s.log.Info("overlay served again", "overlay", name)
	}
	o.info = ov.Info
	o.disabled = !ov.Info.IsEnabled()
	if !o.disabled {
		o.unserved = ""
	} else {
		// Disabled: drained, not dropped. Its attachments stay, are looked
		// up and released; no new one is made.
		s.stopServing(o, disabledMessage(name))
	}
	o.bridges = map[string][families]netip.Prefix{}
	for kind, br := range map[string]*api.BridgeInfo{api.BridgeMesos: ov.MesosBridge, api.BridgeDocker: ov.DockerBridge} {
		if br == nil {
			continue
		}
		var p [families]netip.Prefix
		p[0], _ = netip.ParsePrefix(br.IP)
		p[1], _ = netip.ParsePrefix(br.IP6)
		o.bridges[kind] = p
	}
	b.Add(change{Writes: o.learnMasterBlocks(s.id, v.Blocks, s.grow.returned)})
	b.Add(change{Writes: s.forgetReturned(o, v)})
	errs := parseErrs
	sy := s.overlaySync(name)
	o.unreserveGateways()
	for fam := range families {
		ringWrite, dirty, err := o.seed(sy, fam, v)
		errs = append(errs, err)
		s.ringWritten(ringID{name, ipfamily.Name(fam)}, ringWrite, dirty, b)
	}
	o.reserveGateways()
	for fam := range families {
		writes, _ := o.syncBlocks(sy, fam)
		b.Add(change{Writes: writes})
	}
	s.metrics.Isolated.WithLabelValues(name).Set(float64(o.isolatedCount(ownRecordBlocks(v, s.id))))
	switch o.seedErr = errors.Join(errs...); {
	case errors.Is(o.seedErr, errRingUnread):
		s.log.Error("overlay not served: its persisted ring could not be read", "overlay", name, "err", o.seedErr)
	case o.seedErr != nil:
		s.log.Error("the ring refused the masters' leases", "overlay", name, "err", o.seedErr)
	}
	level := slog.LevelDebug
	if created {
		level = slog.LevelError
	}
	s.claimPersisted(o, level)
	if created {
		s.reclaimFromCNICache(o, b.Add)
	}
}

// statusMessage says why an overlay of the record takes no allocation.
func statusMessage(ov *api.AgentOverlay) string {
	return fmt.Sprintf("overlay %q has no subnet leased to this agent yet", ov.Info.Name)
}

// drainedNow tells the agent (Growth.OnChange) when a release left a
// disabled overlay without attachments: it removes the overlay's bridges,
// routes and conflist at once rather than at its next resync.
func (s *Service) drainedNow(network string) {
	s.mu.Lock()
	o := s.overlays[network]
	drained := o != nil && o.disabled && len(o.attached) == 0
	s.mu.Unlock()
	if drained {
		s.changed()
	}
}

// disabledMessage says why a disabled overlay takes no allocation.
func disabledMessage(name string) string {
	return fmt.Sprintf("overlay %q is disabled (\"enabled\": false in the masters' network configuration): the containers attached to it keep their addresses until they leave, and no new one is attached; use an enabled overlay", name)
}

// stopServing refuses new allocations on an overlay, keeping what it holds.
func (s *Service) stopServing(o *overlay, why string) {
	if o.unserved == "" {
		s.log.Warn("overlay no longer served: new allocations are refused, existing ones can be released", "overlay", o.name, "why", why)
	}
	o.unserved = why
}

// retire drops an overlay's allocators; its allocations go back to the
// persisted ones, claimed again when the overlay is seeded anew. The caller
// has quiesced (nothing of the overlay is in flight).
func (s *Service) retire(o *overlay) {
	if len(o.attached) > 0 {
		if s.persist[o.name] == nil {
			s.persist[o.name] = map[ring.Attachment]allocRecord{}
		}
		for at, rec := range o.attached {
			s.persist[o.name][at] = rec
		}
	}
	delete(s.overlays, o.name)
	s.gossip.Forget(o.name)
}

// seed creates (or re-seeds) the allocator of one overlay family from the
// view's leases, and queues its ring's write when it changed. What the
// masters' leases change, every agent changes alike from its own view, so
// it is marked known and never broadcast (that would cost every agent a
// whole ring per registration, cluster-wide); so is the persisted ring
// merged back after a restart, which was announced before (anti-entropy
// repairs what was not). The ring is written at once (ringWrite) only when
// what this agent owns moved; dirty: other agents' entries changed only.
func (o *overlay) seed(sy overlaySync, fam int, v View) (ringWrite []write, dirty bool, err error) {
	u := o.universe[fam]
	if !u.IsValid() {
		return nil, false, nil
	}
	alloc := o.alloc[fam]
	fresh := alloc == nil
	var saved []byte
	if fresh && sy.disk != nil {
		// Read before the allocator exists: a ring that cannot be read
		// leaves the family without one (the next sync reads again),
		// never with a fresh ring that forgot its grants.
		if saved, err = sy.disk.savedRing(o.name, fam); err != nil {
			return nil, false, err
		}
	}
	if fresh {
		if alloc, err = ring.NewAllocator(sy.self, u); err != nil {
			return nil, false, err
		}
		if sy.sign != nil {
			alloc.SetSigner(sy.sign)
		}
		o.alloc[fam] = alloc
	}
	ownedBefore := alloc.Owned()
	// Each record's blocks are its agent's complete lease set: a newer one
	// replaces the older (a block given back or granted away leaves).
	var sets []ring.LeaseSet
	for _, p := range v.Peers {
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
	for _, hb := range o.blocks[fam] {
		if hb.Origin == OriginGrow && hb.Version > 0 {
			leases = append(leases, ring.Lease{Owner: sy.self, Prefix: hb.Prefix, Version: hb.Version})
		}
	}
	tombs := make([]ring.Tombstone, 0, len(v.Tombstones))
	for _, t := range v.Tombstones {
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
		sy.log.Error("the masters' records gave another agent an address this agent's container holds: isolated (the container keeps it, nothing else is handed out there; see carve ipam check)",
			"overlay", o.name, "address", al.Addr, "container", al.ContainerID, "ifname", al.Interface, "now_leased_to", owner)
	}
	sy.known.markKnown(o, fam, func(k *ring.Ring) error { _, err := k.SeedSets(sets, tombs); return err })
	if len(leases) > 0 {
		more, err := alloc.Seed(leases, nil)
		if err != nil {
			return nil, false, err
		}
		changed = changed || more
		sy.known.markKnown(o, fam, func(k *ring.Ring) error { _, err := k.Seed(leases, nil); return err })
	}
	if saved != nil {
		// Grants made through the ring live only in the ring: merge the
		// persisted one back.
		merged, err := alloc.MergeEncoded(saved)
		if err != nil {
			sy.log.Warn("persisted ring not merged", "overlay", o.name, "family", ipfamily.Name(fam), "err", err)
		} else {
			sy.known.markKnown(o, fam, func(k *ring.Ring) error {
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
	if fresh && sy.ownClaim != nil {
		if resigned, err := alloc.Resign(sy.ownClaim); err != nil {
			sy.log.Warn("ring claims signed again with the new claim key", "overlay", o.name, "family", ipfamily.Name(fam), "err", err)
		} else if resigned {
			sy.log.Info("ring claims signed again with the new claim key", "overlay", o.name, "family", ipfamily.Name(fam))
			changed = true
		}
	}
	// Tokens others wrote in this agent's leases (a grantee's return the
	// masters recorded since) are outbid by its own, so that no stale
	// grant of its own counts again anywhere (ring.Allocator.Sweep);
	// announced with the sync.
	if swept, err := alloc.Sweep(); err != nil {
		sy.log.Warn("ring sweep of this agent's leases", "overlay", o.name, "family", ipfamily.Name(fam), "err", err)
	} else {
		changed = changed || swept
	}
	switch {
	case fresh || !slices.Equal(ownedBefore, alloc.Owned()):
		return []write{putRing(o.name, fam, alloc.EncodeRing())}, false, nil
	case changed:
		// Other agents' leases only: derived again from the masters'
		// records (or the persisted membership) after a restart, and
		// written with the next periodic write, not per registration.
		return nil, true, nil
	}
	return nil, false, nil
}

// learnMasterBlocks adds the grown blocks the masters' record lists that
// this agent does not hold (after a lost data dir), and returns their
// writes. Not one it gave back (returned, or a grant its ring gives to
// another agent already): until the masters take the return their record
// still lists it, and taking it from there would hand out addresses the
// masters free (a grow block after a restart), or drop it again at once
// (a grant, at every sync while the masters are away). The caller has
// quiesced.
func (o *overlay) learnMasterBlocks(self string, blocks []MasterBlock, returned map[netip.Prefix]uint64) (writes []write) {
	for _, mb := range blocks {
		if mb.Overlay != o.name || !mb.Prefix.IsValid() {
			continue
		}
		fam := ipfamily.Of(mb.Prefix.Addr())
		if o.held(fam, mb.Prefix) != nil || mb.Version <= returned[mb.Prefix] {
			continue
		}
		if _, ok := o.bridges[mb.Bridge]; !ok || !o.universe[fam].IsValid() {
			continue
		}
		if a := o.alloc[fam]; a != nil {
			if owner, _ := a.Ring().Owner(blockaddr.Gateway(mb.Prefix)); owner != "" && owner != self {
				continue // given to another agent in the ring (given back)
			}
		}
		if _, inside := blockaddr.OverlapsAny(o.firstBlocks(fam), mb.Prefix); inside {
			// A block this agent granted and got back, which the masters
			// record as a grant to it: it is part of a first block.
			continue
		}
		hb := &heldBlock{Overlay: o.name, Family: fam, Bridge: mb.Bridge, Prefix: mb.Prefix, Origin: OriginGrow, Version: mb.Version, Recorded: true}
		if mb.Donor != "" {
			hb.Origin, hb.Donor, hb.Version = OriginGrant, mb.Donor, 0
		}
		o.blocks[fam] = append(o.blocks[fam], hb)
		slices.SortFunc(o.blocks[fam], func(x, y *heldBlock) int { return x.Prefix.Addr().Compare(y.Prefix.Addr()) })
		writes = append(writes, putBlock(hb))
	}
	return writes
}

// syncBlocks brings the held blocks of a family in line with the ring: a
// range this agent owns outside its own leases and outside the blocks it
// knows is a grant (from an answer, from gossip, or one it held before its
// data dir was lost): it becomes a block of the bridge that asked for space
// (the mesos bridge when none did). A held block whose gateway the ring no
// longer gives this agent is dropped. It returns the writes, and whether
// new blocks were adopted. The caller holds s.mu.
func (o *overlay) syncBlocks(sy overlaySync, fam int) (writes []write, adopted bool) {
	a := o.alloc[fam]
	if a == nil || len(o.bridges) == 0 {
		return nil, false
	}
	r := a.Ring()
	firsts := o.firstBlocks(fam)
	var keep []*heldBlock
	for _, b := range o.blocks[fam] {
		if first, inside := blockaddr.OverlapsAny(firsts, b.Prefix); inside {
			// A block this agent granted, given back: it is part of
			// the bridge's first sub-subnet again, not a prefix of its own.
			o.unreserveGateway(fam, b.Prefix)
			sy.log.Info("a block given back merged into the bridge's first block", "overlay", o.name, "block", b.Prefix, "into", first)
			writes = append(writes, deleteBlock(b))
			continue
		}
		if owner, _ := r.Owner(blockaddr.Gateway(b.Prefix)); owner != sy.self {
			o.unreserveGateway(fam, b.Prefix)
			sy.log.Warn("a block is no longer this agent's in the ring: dropped", "overlay", o.name, "block", b.Prefix, "origin", b.Origin, "owner", owner)
			writes = append(writes, deleteBlock(b))
			continue
		}
		judged, ok := o.judgeRecorded(sy, fam, b)
		writes = append(writes, judged...)
		if !ok {
			continue // the records took it back (recorded.go)
		}
		keep = append(keep, b)
	}
	o.blocks[fam] = keep
	// What this agent owns inside a bridge's first sub-subnet is that
	// bridge's (a grant given back merges into it), and so is what its
	// leases and held blocks cover.
	covers := slices.Clone(firsts)
	for _, l := range r.Leases() {
		if l.Owner == sy.self {
			covers = append(covers, l.Prefix)
		}
	}
	for _, b := range o.blocks[fam] {
		covers = append(covers, b.Prefix)
	}
	bridge := sy.asking(fam)
	if _, ok := o.bridges[bridge]; !ok {
		bridge = sortedKeys(o.bridges)[len(o.bridges)-1] // mesos sorts after docker
	}
	minBits := blockaddr.MinBits(fam)
	for _, owned := range r.Blocks(sy.self) {
		for _, p := range blockaddr.Uncovered(owned, covers) {
			if p.Bits() > minBits {
				continue // too small to hold a gateway and a container
			}
			if why, ok := mayAdopt(sy, p); !ok {
				if sy.growing != nil && sy.growing(fam) {
					continue // perhaps the grant asked for, its answer on the way
				}
				if o.unsolicited == nil {
					o.unsolicited = map[netip.Prefix]bool{}
				}
				if !o.unsolicited[p] {
					o.unsolicited[p] = true
					sy.refused(unsolicitedGrant)
					sy.log.Warn("the ring gives this agent a range it did not ask for: not used", "overlay", o.name, "block", p,
						"granted_by", blockaddr.LeaseOwner(r, sy.self, p), "why", why)
				}
				continue
			}
			b := &heldBlock{Overlay: o.name, Family: fam, Bridge: bridge, Prefix: p, Origin: OriginGrant, Donor: blockaddr.LeaseOwner(r, sy.self, p),
				Recorded: sy.recorded != nil && sy.recorded(p)}
			o.blocks[fam] = append(o.blocks[fam], b)
			writes = append(writes, putBlock(b))
			adopted = true
			sy.log.Info("block granted through the ring", "overlay", o.name, "bridge", bridge, "block", p, "donor", b.Donor)
		}
	}
	slices.SortFunc(o.blocks[fam], func(x, y *heldBlock) int { return x.Prefix.Addr().Compare(y.Prefix.Addr()) })
	o.reserveGateways()
	return writes, adopted
}

// mayAdopt is the one rule of what space beyond the masters' records an
// agent uses (docs/design.md, "The space an agent allocates in"): the
// masters' signed records give it its lease, its grown blocks and the
// grants they recorded (learnMasterBlocks brings those in); beyond them
// only a grant it asked for itself, with the donor's verified statement in
// hand (acceptAnswer), the one exception that lets growth work while the
// masters are unreachable. A recorded block the ring gives this agent only
// later (its data dir was lost; the donor's ring comes by gossip) is
// adopted then. What any other host writes in the ring, even
// its own signed word in its own space, may show this agent as the owner
// of a range; it never makes it place a container there.
func mayAdopt(sy overlaySync, p netip.Prefix) (why string, ok bool) {
	if sy.expected != nil && sy.expected(p) {
		return "", true
	}
	return "neither the masters' records nor a grant this agent asked for give it the range", false
}

// recordedBlock tells whether the masters' record of this agent lists a
// grown or granted block of the overlay that holds p.
func recordedBlock(blocks []MasterBlock, overlay string, p netip.Prefix) bool {
	for _, mb := range blocks {
		if mb.Overlay == overlay && mb.Prefix.Contains(p.Addr()) && mb.Prefix.Bits() <= p.Bits() {
			return true
		}
	}
	return false
}

// expectedGrant tells whether p lies inside one of the grants expected.
func expectedGrant(expected []netip.Prefix, p netip.Prefix) bool {
	for _, e := range expected {
		if e.Contains(p.Addr()) && e.Bits() <= p.Bits() {
			return true
		}
	}
	return false
}

// claimPersisted takes back the addresses of persisted allocations that the
// overlay's rings give this agent (nothing to write: the records are on disk).
func (s *Service) claimPersisted(o *overlay, level slog.Level) {
	for _, at := range sortedAttachments(s.persist[o.name]) {
		rec := s.persist[o.name][at]
		var errs []error
		var claimed []int
		for fam := range families {
			addr := rec.addr(fam)
			if !addr.IsValid() {
				continue
			}
			if o.alloc[fam] == nil {
				errs = append(errs, fmt.Errorf("%w: the overlay has no IPv%s subnet for %s", ring.ErrNotOwned, ipfamily.Name(fam), addr))
				continue
			}
			if err := o.alloc[fam].Claim(at, addr); err != nil {
				errs = append(errs, err)
				continue
			}
			claimed = append(claimed, fam)
		}
		if err := errors.Join(errs...); err != nil {
			// Keep the record: the container may still use the address,
			// and a later lease or grant can make it claimable again.
			for _, fam := range claimed {
				o.alloc[fam].Release(at)
			}
			s.log.Log(context.Background(), level, "persisted allocation not claimable", "overlay", o.name, "container", at.ContainerID, "ifname", at.Interface, "err", err)
			continue
		}
		o.attached[at] = rec
		delete(s.persist[o.name], at)
	}
}

// ringDisk is the persistence beneath an overlay's sync: its rings as
// last written.
type ringDisk interface {
	savedRing(overlay string, fam int) ([]byte, error)
}

// ringKnowledge is the gossip beneath an overlay's sync: what every agent
// already holds of a ring (the masters' leases, a ring read back), which
// is never broadcast.
type ringKnowledge interface {
	markKnown(o *overlay, fam int, f func(known *ring.Ring) error)
}

// overlaySync is what a sync of an overlay reaches beneath it.
type overlaySync struct {
	self string
	// sign signs the claims of the allocators it makes (nil: unsigned);
	// ownClaim tells whether one of its claims verifies under its
	// current claim key (nil: no key).
	sign     func(msg []byte) []byte
	ownClaim func(ring.Claim) bool
	disk     ringDisk // nil: the rings on disk are another cluster's, never read
	known    ringKnowledge
	// asking is the bridge a family asks space for now (a range the ring
	// gives this agent beyond what it holds becomes that bridge's).
	asking func(fam int) string
	// expected tells whether p is (inside) a grant this agent asked for
	// and holds the donor's verified statement of (mayAdopt).
	expected func(p netip.Prefix) bool
	// recorded tells whether the masters' record of this agent lists a
	// grown or granted block holding p; nil while the view has no record
	// of it (judgeRecorded judges nothing then).
	recorded func(p netip.Prefix) bool
	// refused counts a range not adopted, by reason; growing tells whether
	// a growth of the family is in flight (its answer's ring may come by
	// gossip before the answer: not yet a refusal).
	refused func(reason string)
	growing func(fam int) bool
	log     *slog.Logger
}

// overlaySync is the layers beneath a sync of an overlay; the caller holds
// s.mu.
func (s *Service) overlaySync(name string) overlaySync {
	sy := overlaySync{self: s.id, sign: s.claims.Signer(), ownClaim: s.claims.OwnClaimValid(), known: s, log: s.log,
		asking: func(fam int) string { return s.askingBridge(name, fam) },
		expected: func(p netip.Prefix) bool {
			return expectedGrant(s.expectedGrants[name], p) || recordedBlock(s.view.Blocks, name, p)
		},
		refused: func(reason string) { s.metrics.ClaimsRefused.WithLabelValues(reason).Inc() },
		growing: func(fam int) bool { return s.grower.Growing(name, fam) }}
	if s.view.Self != nil {
		sy.recorded = func(p netip.Prefix) bool { return recordedBlock(s.view.Blocks, name, p) }
	}
	if !s.staleRings {
		sy.disk = ringStore{s.db, s.dbPath}
	}
	return sy
}

// ringWritten queues the write of a ring whose owned ranges moved, or marks
// it dirty (written with the next periodic write); the caller holds s.mu.
func (s *Service) ringWritten(k ringID, ringWrite []write, dirty bool, b *batch) {
	switch {
	case len(ringWrite) > 0:
		delete(s.dirtyRings, k)
		b.Add(change{Writes: ringWrite})
	case dirty:
		s.dirtyRings[k] = true
	}
}
