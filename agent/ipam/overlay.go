package ipam

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
)

// families: index 0 is IPv4, 1 is IPv6, in every [2] array of this package.
const families = 2

// familyName is the family as the API and the ring messages write it.
func familyName(fam int) string {
	if fam == 1 {
		return "6"
	}
	return "4"
}

// familyIndex is the index of a family name ("4", "6"; checked by the
// caller).
func familyIndex(name string) int {
	if name == "6" {
		return 1
	}
	return 0
}

// overlay is the address space of one overlay on this agent: one ring
// allocator per address family, seeded from the masters' leases.
type overlay struct {
	name     string
	universe [families]netip.Prefix // the overlay's subnets (invalid: no such family)
	alloc    [families]*ring.Allocator
	bridges  map[string][families]netip.Prefix // bridge kind -> its sub-subnets
	attached map[ring.Attachment]allocRecord
	// blocks are the blocks the bridges hold beyond their first
	// sub-subnet, per family, in address order (see blocks.go).
	blocks [families][]*heldBlock
	// gateways are the bridge gateways reserved in the allocators.
	gateways map[netip.Addr]bool
	// seedErr is why the ring refused the masters' leases; while it is set
	// the ring may own nothing, and "exhausted" would mislead.
	seedErr error
	// unserved, when set, says why the overlay takes no new allocation (it
	// is no longer OK on this agent). Its allocations stay: runtimes look
	// them up and release them while they clean up.
	unserved string
}

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
	} else if o.unserved != "" {
		s.log.Info("overlay served again", "overlay", name)
	}
	o.unserved = ""
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
	s.learnMasterBlocks(o, v, b)
	errs := parseErrs
	o.unreserveGateways()
	for fam := range families {
		errs = append(errs, s.seed(o, fam, v, b))
	}
	o.reserveGateways()
	for fam := range families {
		writes, _ := s.syncBlocks(o, fam)
		b.add(change{writes: writes})
	}
	if o.seedErr = errors.Join(errs...); o.seedErr != nil {
		s.log.Error("the ring refused the masters' leases", "overlay", name, "err", o.seedErr)
	}
	level := slog.LevelDebug
	if created {
		level = slog.LevelError
	}
	s.claimPersisted(o, level)
	if created {
		s.reclaimFromCNICache(o, b.add)
	}
}

// statusMessage says why an overlay of the record takes no allocation.
func statusMessage(ov *api.AgentOverlay) string {
	return fmt.Sprintf("overlay %q has no subnet leased to this agent yet", ov.Info.Name)
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
	s.forgetGossip(o.name)
}

// seed creates (or re-seeds) the allocator of one overlay family from the
// view's leases, and queues its ring's write when it changed. What the
// masters' leases change, every agent changes alike from its own view, so
// it is marked known and never broadcast (that would cost every agent a
// whole ring per registration, cluster-wide); so is the persisted ring
// merged back after a restart, which was announced before (anti-entropy
// repairs what was not). The ring is written at once only when what this
// agent owns moved.
func (s *Service) seed(o *overlay, fam int, v View, b *batch) (err error) {
	u := o.universe[fam]
	if !u.IsValid() {
		return nil
	}
	alloc := o.alloc[fam]
	fresh := alloc == nil
	if fresh {
		if alloc, err = ring.NewAllocator(s.id, u); err != nil {
			return err
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
			leases = append(leases, ring.Lease{Owner: s.id, Prefix: hb.Prefix, Version: hb.Version})
		}
	}
	tombs := make([]ring.Tombstone, 0, len(v.Tombstones))
	for _, t := range v.Tombstones {
		tombs = append(tombs, ring.Tombstone{Owner: t.AgentID, Version: t.Version})
	}
	changed, err := alloc.SeedSets(sets, tombs)
	if err != nil {
		return err
	}
	s.markKnown(o, fam, func(k *ring.Ring) error { _, err := k.SeedSets(sets, tombs); return err })
	if len(leases) > 0 {
		more, err := alloc.Seed(leases, nil)
		if err != nil {
			return err
		}
		changed = changed || more
		s.markKnown(o, fam, func(k *ring.Ring) error { _, err := k.Seed(leases, nil); return err })
	}
	if fresh && !s.staleRings {
		// Grants made through the ring live only in the ring: merge the
		// persisted one back.
		if saved := savedRing(s.db, o.name, fam); saved != nil {
			merged, err := alloc.MergeEncoded(saved)
			if err != nil {
				s.log.Warn("persisted ring not merged", "overlay", o.name, "family", familyName(fam), "err", err)
			} else {
				s.markKnown(o, fam, func(k *ring.Ring) error {
					r, err := ring.Decode(saved)
					if err == nil {
						_, err = k.Merge(r)
					}
					return err
				})
			}
			changed = changed || merged
		}
	}
	k := ringID{o.name, familyName(fam)}
	switch {
	case fresh || !slices.Equal(ownedBefore, alloc.Owned()):
		delete(s.dirtyRings, k)
		b.add(change{writes: []write{putRing(o.name, fam, alloc.EncodeRing())}})
	case changed:
		// Other agents' leases only: derived again from the masters'
		// records (or the persisted membership) after a restart, and
		// written with the next periodic write, not per registration.
		s.dirtyRings[k] = true
	}
	return nil
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
				errs = append(errs, fmt.Errorf("%w: the overlay has no IPv%s subnet for %s", ring.ErrNotOwned, familyName(fam), addr))
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

func sortedAttachments(m map[ring.Attachment]allocRecord) []ring.Attachment {
	out := make([]ring.Attachment, 0, len(m))
	for at := range m {
		out = append(out, at)
	}
	slices.SortFunc(out, func(a, b ring.Attachment) int {
		return strings.Compare(a.ContainerID+"\x00"+a.Interface, b.ContainerID+"\x00"+b.Interface)
	})
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
