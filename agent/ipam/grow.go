package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/carve-net/carve/agent/ipam/blockaddr"
	"github.com/carve-net/carve/agent/ipam/growth"
	"github.com/carve-net/carve/agent/ipam/overlayspace"
	"github.com/carve-net/carve/ring"
)

// Growth (package growth runs it): the table's side, the blocks the
// masters lease added to a bridge, and the state growth's donations and
// returns keep under s.mu.

// growState is the growth part of a Service, under s.mu.
type growState struct {
	cfg     growth.Config
	granted map[[2]string]netip.Prefix
	// returned: grown blocks given back, by prefix, with their lease
	// version: a masters' record that still lists one is stale.
	returned map[netip.Prefix]uint64
}

func newGrowState(cfg GrowthConfig) growState {
	cfg = cfg.WithDefaults()
	if cfg.UsageInterval == 0 {
		cfg.UsageInterval = defaultUsageInterval
	}
	if cfg.UsageRefresh <= 0 {
		cfg.UsageRefresh = defaultUsageRefresh
	}
	return growState{cfg: cfg, granted: map[[2]string]netip.Prefix{}, returned: map[netip.Prefix]uint64{}}
}

// startGrowth starts growing each family of a bridge whose free addresses
// are below its low-water mark (at zero, when full is set), and returns the
// growths in flight for the bridge.
func (s *Service) startGrowth(overlay, bridge string, full bool) []*growth.Growth {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.overlays[overlay]
	if o == nil || o.Unserved != "" || o.SeedErr != nil {
		return nil
	}
	var out []*growth.Growth
	for fam := range families {
		if o.Alloc[fam] == nil || !o.Bridges[bridge][fam].IsValid() {
			continue
		}
		lw := s.grower.LowWater(o.Bridges[bridge][fam])
		if full {
			lw = max(lw, 1)
		}
		if g := s.grower.Start(growth.Key{Overlay: overlay, Bridge: bridge, Fam: fam}, o.FreeHosts(bridge, fam), lw); g != nil {
			out = append(out, g)
		}
	}
	return out
}

// changed tells the agent that blocks or rings changed.
func (s *Service) changed() { s.grower.Changed() }

// growTable is the Service as the overlay table growth works on
// (growth.Table).
type growTable Service

func (t *growTable) AddGrownBlock(k growth.Key, lb LeasedBlock) error {
	return (*Service)(t).addGrownBlock(k, lb)
}

func (t *growTable) Ask(ctx context.Context, k growth.Key, note func(string)) error {
	return t.asker.Ask(ctx, k.Overlay, k.Bridge, k.Fam, note)
}

func (t *growTable) RequestID() string { return t.asker.RequestID() }

func (t *growTable) Grown(k growth.Key, err error) {
	if k.Fam == 0 {
		t.capacity.NoteGrowth(k.Overlay, err == nil, errors.Is(err, errOverlayFull), time.Now())
	}
}

func (t *growTable) Go(f func(ctx context.Context)) error {
	if !t.bg.Go(f) {
		return errStopping
	}
	return nil
}

// addGrownBlock makes a block the masters leased a block of the bridge: a
// lease of this agent in the ring, persisted with the ring.
func (s *Service) addGrownBlock(k growth.Key, lb LeasedBlock) error {
	s.mu.Lock()
	o := s.overlays[k.Overlay]
	if o == nil || o.Alloc[k.Fam] == nil {
		s.mu.Unlock()
		return fmt.Errorf("overlay %q is not served any more", k.Overlay)
	}
	u := o.Universe[k.Fam]
	if !lb.Prefix.IsValid() || lb.Prefix.Masked() != lb.Prefix || !u.Contains(lb.Prefix.Addr()) || lb.Prefix.Bits() <= u.Bits() ||
		lb.Prefix.Bits() > blockaddr.MinBits(k.Fam) || lb.Version == 0 {
		s.mu.Unlock()
		return fmt.Errorf("block %v (version %d) is not a block of %v", lb.Prefix, lb.Version, u)
	}
	// The masters' watch may have brought the new record, and with it
	// this block (LearnMasterBlocks), before the grow's answer came back.
	if slices.ContainsFunc(o.Blocks[k.Fam], func(hb *heldBlock) bool {
		return hb.Prefix == lb.Prefix && hb.Bridge == k.Bridge && hb.Origin == OriginGrow
	}) {
		s.mu.Unlock()
		return nil
	}
	for kind := range o.Bridges {
		for _, p := range o.BridgeBlocks(kind, k.Fam) {
			if p.Overlaps(lb.Prefix) {
				s.mu.Unlock()
				return fmt.Errorf("block %v overlaps the %s bridge's %v", lb.Prefix, kind, p)
			}
		}
	}
	a := o.Alloc[k.Fam]
	var err error
	if len(lb.Held) > 0 && slices.Contains(lb.Held, lb.Prefix) {
		_, err = a.SeedSets([]ring.LeaseSet{{Owner: s.id, Version: lb.Version, Prefixes: lb.Held}}, nil)
	} else {
		_, err = a.Seed([]ring.Lease{{Owner: s.id, Prefix: lb.Prefix, Version: lb.Version}}, nil)
	}
	if err != nil {
		s.mu.Unlock()
		return err
	}
	hb := &heldBlock{Overlay: k.Overlay, Family: k.Fam, Bridge: k.Bridge, Prefix: lb.Prefix, Origin: OriginGrow, Version: lb.Version}
	o.Blocks[k.Fam] = append(o.Blocks[k.Fam], hb)
	slices.SortFunc(o.Blocks[k.Fam], func(x, y *heldBlock) int { return x.Prefix.Addr().Compare(y.Prefix.Addr()) })
	o.ReserveGateways()
	enc := a.EncodeRing()
	b := s.commits.Enqueue(change{Writes: []write{overlayspace.PutBlock(hb), putRing(k.Overlay, k.Fam, enc)}})
	s.mu.Unlock()
	s.log.Info("block leased by the masters", "overlay", k.Overlay, "bridge", k.Bridge, "block", lb.Prefix)
	if err := s.commits.Flush(b); err != nil {
		return fmt.Errorf("persist block: %w", err)
	}
	s.gossip.Announce()
	return nil
}
