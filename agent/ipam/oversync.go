package ipam

// How a sync changes an overlay: the masters' view applied to it (its
// subnets, bridges, the blocks the masters list), its rings seeded from
// everyone's leases and its held blocks brought in line with the ring
// (package overlayspace decides both), and its persisted allocations
// claimed back. Persistence and gossip sit beneath it: a sync returns
// writes for the group commit, reads the rings on disk through ringStore
// and tells the gossip what every agent already knows through ringKnown.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"

	"github.com/carve-net/carve/agent/ipam/ipfamily"
	"github.com/carve-net/carve/agent/ipam/overlayspace"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
)

// The overlay table's entries and their sync are package overlayspace's.
type (
	overlay     = overlayspace.Overlay
	heldBlock   = overlayspace.HeldBlock
	allocRecord = overlayspace.AllocRecord
	overlaySync = overlayspace.Sync
)

// families: index 0 is IPv4, 1 is IPv6, in every [2] array of this package.
const families = ipfamily.Count

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
			o.Disabled = false
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
	if o != nil && o.Universe != universe {
		s.log.Warn("the overlay's subnets changed: its rings start over", "overlay", name, "was", o.Universe, "now", universe)
		s.retire(o)
		o = nil
	}
	created := o == nil
	if created {
		o = &overlay{Name: name, Universe: universe, Attached: map[ring.Attachment]allocRecord{}, Gateways: map[netip.Addr]bool{}}
		for _, b := range s.savedBlocks[name] {
			if universe[b.Family].IsValid() && universe[b.Family].Contains(b.Prefix.Addr()) {
				o.Blocks[b.Family] = append(o.Blocks[b.Family], b)
			}
		}
		delete(s.savedBlocks, name)
		s.overlays[name] = o
	} else if o.Unserved != "" && ov.Info.IsEnabled() {
		s.log.Info("overlay served again", "overlay", name)
	}
	o.Info = ov.Info
	o.Disabled = !ov.Info.IsEnabled()
	if !o.Disabled {
		o.Unserved = ""
	} else {
		// Disabled: drained, not dropped. Its attachments stay, are looked
		// up and released; no new one is made.
		s.stopServing(o, disabledMessage(name))
	}
	o.Bridges = map[string][families]netip.Prefix{}
	for kind, br := range map[string]*api.BridgeInfo{api.BridgeMesos: ov.MesosBridge, api.BridgeDocker: ov.DockerBridge} {
		if br == nil {
			continue
		}
		var p [families]netip.Prefix
		p[0], _ = netip.ParsePrefix(br.IP)
		p[1], _ = netip.ParsePrefix(br.IP6)
		o.Bridges[kind] = p
	}
	b.Add(change{Writes: o.LearnMasterBlocks(s.id, v.Blocks, s.grow.returned)})
	b.Add(change{Writes: s.forgetReturned(o, v)})
	errs := parseErrs
	sy := s.overlaySync(name)
	o.UnreserveGateways()
	for fam := range families {
		ringWrite, dirty, err := o.Seed(sy, fam, v.Peers, v.Tombstones)
		errs = append(errs, err)
		s.ringWritten(ringID{name, ipfamily.Name(fam)}, ringWrite, dirty, b)
	}
	o.ReserveGateways()
	for fam := range families {
		writes, _ := o.SyncBlocks(sy, fam)
		b.Add(change{Writes: writes})
	}
	s.metrics.Isolated.WithLabelValues(name).Set(float64(o.IsolatedCount(ownRecordBlocks(v, s.id))))
	switch o.SeedErr = errors.Join(errs...); {
	case errors.Is(o.SeedErr, errRingUnread):
		s.log.Error("overlay not served: its persisted ring could not be read", "overlay", name, "err", o.SeedErr)
	case o.SeedErr != nil:
		s.log.Error("the ring refused the masters' leases", "overlay", name, "err", o.SeedErr)
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
	drained := o != nil && o.Disabled && len(o.Attached) == 0
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
	if o.Unserved == "" {
		s.log.Warn("overlay no longer served: new allocations are refused, existing ones can be released", "overlay", o.Name, "why", why)
	}
	o.Unserved = why
}

// retire drops an overlay's allocators; its allocations go back to the
// persisted ones, claimed again when the overlay is seeded anew. The caller
// has quiesced (nothing of the overlay is in flight).
func (s *Service) retire(o *overlay) {
	if len(o.Attached) > 0 {
		if s.persist[o.Name] == nil {
			s.persist[o.Name] = map[ring.Attachment]allocRecord{}
		}
		for at, rec := range o.Attached {
			s.persist[o.Name][at] = rec
		}
	}
	delete(s.overlays, o.Name)
	s.gossip.Forget(o.Name)
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
	for _, at := range sortedAttachments(s.persist[o.Name]) {
		rec := s.persist[o.Name][at]
		var errs []error
		var claimed []int
		for fam := range families {
			addr := rec.Addr(fam)
			if !addr.IsValid() {
				continue
			}
			if o.Alloc[fam] == nil {
				errs = append(errs, fmt.Errorf("%w: the overlay has no IPv%s subnet for %s", ring.ErrNotOwned, ipfamily.Name(fam), addr))
				continue
			}
			if err := o.Alloc[fam].Claim(at, addr); err != nil {
				errs = append(errs, err)
				continue
			}
			claimed = append(claimed, fam)
		}
		if err := errors.Join(errs...); err != nil {
			// Keep the record: the container may still use the address,
			// and a later lease or grant can make it claimable again.
			for _, fam := range claimed {
				o.Alloc[fam].Release(at)
			}
			s.log.Log(context.Background(), level, "persisted allocation not claimable", "overlay", o.Name, "container", at.ContainerID, "ifname", at.Interface, "err", err)
			continue
		}
		o.Attached[at] = rec
		delete(s.persist[o.Name], at)
	}
}

// overlaySync is the layers beneath a sync of an overlay; the caller holds
// s.mu.
func (s *Service) overlaySync(name string) overlaySync {
	sy := overlaySync{Self: s.id, Sign: s.claims.Signer(), OwnClaim: s.claims.OwnClaimValid(), Known: ringKnown{s}, Log: s.log,
		Asking: func(fam int) string { return s.askingBridge(name, fam) },
		Expected: func(p netip.Prefix) bool {
			return expectedGrant(s.expectedGrants[name], p) || recordedBlock(s.view.Blocks, name, p)
		},
		Refused: func(reason string) { s.metrics.ClaimsRefused.WithLabelValues(reason).Inc() },
		Growing: func(fam int) bool { return s.grower.Growing(name, fam) }}
	if s.view.Self != nil {
		sy.Recorded = func(p netip.Prefix) bool { return recordedBlock(s.view.Blocks, name, p) }
	}
	if !s.staleRings {
		sy.Disk = ringStore{s.db, s.dbPath}
	}
	return sy
}

// ringKnown is the gossip beneath a sync (overlayspace.RingKnowledge).
type ringKnown struct{ s *Service }

// MarkKnown marks what every agent already holds of a ring (markKnown).
func (k ringKnown) MarkKnown(o *overlay, fam int, f func(known *ring.Ring) error) {
	k.s.markKnown(o, fam, f)
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
