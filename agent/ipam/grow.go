package ipam

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/carve-net/carve/agent/ipam/ipfamily"
	"github.com/carve-net/carve/ring"
)

// Growth. A bridge starts with its first sub-subnet (the masters' lease).
// When its free addresses fall below a low-water mark, the agent gets
// another block in the background: first from the masters (BlockSource.Grow,
// a lease committed in Raft), and when they have none left or cannot be
// reached, from a peer through the ring: a unicast space request on the ring
// channel to a peer chosen by free space (ring.Ring.ChoosePeerToAsk), which
// grants a CIDR-aligned free block of its own ranges (ring.Allocator
// DonateBlock), persists and broadcasts its ring, and answers with it. Only
// the ring CRDT decides who owns what: the recipient owns the block once the
// merged ring says so, whatever an answer claims. The recipient reports the
// grant to the masters through a durable outbox. A grown block that stays
// empty for GrowthConfig.IdleReturn goes back: to its donor with a grant back
// through the ring, or to the masters (BlockSource.Return).

// growKey names a growth in flight.
type growKey struct {
	overlay, bridge string
	fam             int
}

// growth is one growth in flight; done closes when it ends with err.
type growth struct {
	done chan struct{}
	err  error
	// asked says, while it runs, what it asked and was answered so far
	// (under s.mu): an ADD whose wait ends first says it.
	asked []string
}

// growState is the growth part of a Service, under s.mu.
type growState struct {
	cfg      GrowthConfig
	inflight map[growKey]*growth
	granted  map[[2]string]netip.Prefix
	// returned: grown blocks given back, by prefix, with their lease
	// version: a masters' record that still lists one is stale.
	returned map[netip.Prefix]uint64
}

func newGrowState(cfg GrowthConfig) growState {
	if cfg.Wait <= 0 {
		cfg.Wait = 10 * time.Second
	}
	if cfg.IdleReturn == 0 {
		cfg.IdleReturn = 10 * time.Minute
	}
	if cfg.AnswerTimeout <= 0 {
		cfg.AnswerTimeout = time.Second
	}
	if cfg.RefuseMemory <= 0 {
		cfg.RefuseMemory = time.Minute
	}
	if cfg.Seed == 0 {
		cfg.Seed = rand.Uint64()
	}
	if cfg.UsageInterval == 0 {
		cfg.UsageInterval = defaultUsageInterval
	}
	if cfg.UsageRefresh <= 0 {
		cfg.UsageRefresh = defaultUsageRefresh
	}
	return growState{
		cfg: cfg, inflight: map[growKey]*growth{}, granted: map[[2]string]netip.Prefix{},
		returned: map[netip.Prefix]uint64{},
	}
}

// growTimeout bounds one growth (the masters, then a few peers).
const growTimeout = 30 * time.Second

// errStillGrowing marks a growth still in flight when the ADD's wait ended.
var errStillGrowing = errors.New("still growing")

// waitGrowths waits for the growths until they end or ctx does, and
// returns their errors; one that is still in flight when ctx ends counts
// as errStillGrowing, with what it asked so far.
func (s *Service) waitGrowths(ctx context.Context, gs []*growth) []error {
	var errs []error
	var asking []string
	growing := false
	for _, g := range gs {
		select {
		case <-g.done:
		case <-ctx.Done():
		}
		select {
		case <-g.done:
			if g.err != nil {
				errs = append(errs, g.err)
			}
		default:
			growing = true
			s.mu.Lock()
			asking = append(asking, g.asked...)
			s.mu.Unlock()
		}
	}
	if growing {
		so := "no master or peer has granted a block yet"
		if len(asking) > 0 {
			so += ": " + strings.Join(asking, "; ")
		}
		errs = append(errs, fmt.Errorf("%w (%s): try again", errStillGrowing, so))
	}
	return errs
}

// lowWater is a bridge's low-water mark in a family. The caller holds s.mu.
func (s *Service) lowWater(o *overlay, bridge string, fam int) uint64 {
	if lw := s.grow.cfg.LowWater; lw != 0 {
		return uint64(max(lw, 0))
	}
	first := o.bridges[bridge][fam]
	hostBits := first.Addr().BitLen() - first.Bits()
	if hostBits >= 63 {
		return 1 << 60
	}
	return max(2, (uint64(1)<<hostBits)/8)
}

// startGrowth starts growing each family of a bridge whose free addresses
// are below its low-water mark (at zero, when full is set), and returns the
// growths in flight for the bridge.
func (s *Service) startGrowth(overlay, bridge string, full bool) []*growth {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.overlays[overlay]
	if o == nil || o.unserved != "" || o.seedErr != nil {
		return nil
	}
	var out []*growth
	for fam := range families {
		if o.alloc[fam] == nil || !o.bridges[bridge][fam].IsValid() {
			continue
		}
		lw := s.lowWater(o, bridge, fam)
		if full {
			lw = max(lw, 1)
		}
		k := growKey{overlay, bridge, fam}
		if g := s.grow.inflight[k]; g != nil {
			out = append(out, g)
			continue
		}
		if o.freeHosts(bridge, fam) >= lw {
			continue
		}
		g := &growth{done: make(chan struct{})}
		if !s.bg.Go(func(ctx context.Context) { s.runGrowth(ctx, k, g) }) {
			// Stopping: no growth starts, and the ADD that would wait
			// for one is told why.
			g.err = errStopping
			close(g.done)
			out = append(out, g)
			continue
		}
		s.grow.inflight[k] = g
		out = append(out, g)
	}
	return out
}

// runGrowth is one growth, in a goroutine of s.bg: ctx ends when the
// service stops.
func (s *Service) runGrowth(ctx context.Context, k growKey, g *growth) {
	ctx, cancel := context.WithTimeout(ctx, growTimeout)
	defer cancel()
	err := s.growOnce(ctx, k, g)
	if err != nil {
		s.log.Warn("a bridge could not grow", "overlay", k.overlay, "bridge", k.bridge, "family", ipfamily.Name(k.fam), "err", err)
	}
	s.mu.Lock()
	delete(s.grow.inflight, k)
	if k.fam == 0 {
		s.capacity.NoteGrowth(k.overlay, err == nil, errors.Is(err, errOverlayFull), time.Now())
	}
	g.err = err
	close(g.done)
	s.mu.Unlock()
	if err == nil {
		s.changed()
	}
}

// changed tells the agent that blocks or rings changed.
func (s *Service) changed() {
	if f := s.grow.cfg.OnChange; f != nil {
		f()
	}
}

// growOnce gets one block: from the masters, else from a peer. g, when
// set, keeps what it asked so far.
func (s *Service) growOnce(ctx context.Context, k growKey, g *growth) error {
	if src := s.grow.cfg.Source; src != nil {
		lb, err := src.Grow(ctx, k.overlay, k.bridge, ipfamily.Number(k.fam), s.asker.RequestID())
		switch {
		case err == nil:
			if err = s.addGrownBlock(k, lb); err == nil {
				s.metrics.Grows.WithLabelValues("master", "ok").Inc()
				return nil
			}
			s.metrics.Grows.WithLabelValues("master", "error").Inc()
			s.log.Error("the masters' block could not be used", "overlay", k.overlay, "block", lb.Prefix, "err", err)
		case errors.Is(err, ErrMastersExhausted):
			s.metrics.Grows.WithLabelValues("master", "exhausted").Inc()
			s.metrics.Refused.WithLabelValues("masters_exhausted").Inc()
		case errors.Is(err, ErrQuota):
			s.metrics.Grows.WithLabelValues("master", "quota").Inc()
			s.metrics.Refused.WithLabelValues("quota").Inc()
			return err
		case ctx.Err() != nil:
			return fmt.Errorf("growth stopped: %w", err) // the service stops, or the growth ran out of time
		default:
			s.metrics.Grows.WithLabelValues("master", "unreachable").Inc()
			s.log.Warn("no master answered a grow request: asking a peer", "overlay", k.overlay, "err", err)
		}
	}
	var note func(string)
	if g != nil {
		note = func(asked string) {
			s.mu.Lock()
			g.asked = append(g.asked, asked)
			s.mu.Unlock()
		}
	}
	return s.asker.Ask(ctx, k.overlay, k.bridge, k.fam, note)
}

// addGrownBlock makes a block the masters leased a block of the bridge: a
// lease of this agent in the ring, persisted with the ring.
func (s *Service) addGrownBlock(k growKey, lb LeasedBlock) error {
	s.mu.Lock()
	o := s.overlays[k.overlay]
	if o == nil || o.alloc[k.fam] == nil {
		s.mu.Unlock()
		return fmt.Errorf("overlay %q is not served any more", k.overlay)
	}
	u := o.universe[k.fam]
	if !lb.Prefix.IsValid() || lb.Prefix.Masked() != lb.Prefix || !u.Contains(lb.Prefix.Addr()) || lb.Prefix.Bits() <= u.Bits() ||
		lb.Prefix.Bits() > minBlockBits(k.fam) || lb.Version == 0 {
		s.mu.Unlock()
		return fmt.Errorf("block %v (version %d) is not a block of %v", lb.Prefix, lb.Version, u)
	}
	// The masters' watch may have brought the new record, and with it
	// this block (learnMasterBlocks), before the grow's answer came back.
	if slices.ContainsFunc(o.blocks[k.fam], func(hb *heldBlock) bool {
		return hb.Prefix == lb.Prefix && hb.Bridge == k.bridge && hb.Origin == OriginGrow
	}) {
		s.mu.Unlock()
		return nil
	}
	for kind := range o.bridges {
		for _, p := range o.bridgeBlocks(kind, k.fam) {
			if p.Overlaps(lb.Prefix) {
				s.mu.Unlock()
				return fmt.Errorf("block %v overlaps the %s bridge's %v", lb.Prefix, kind, p)
			}
		}
	}
	a := o.alloc[k.fam]
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
	hb := &heldBlock{Overlay: k.overlay, Family: k.fam, Bridge: k.bridge, Prefix: lb.Prefix, Origin: OriginGrow, Version: lb.Version}
	o.blocks[k.fam] = append(o.blocks[k.fam], hb)
	slices.SortFunc(o.blocks[k.fam], func(x, y *heldBlock) int { return x.Prefix.Addr().Compare(y.Prefix.Addr()) })
	o.reserveGateways()
	enc := a.EncodeRing()
	b := s.commits.Enqueue(change{Writes: []write{putBlock(hb), putRing(k.overlay, k.fam, enc)}})
	s.mu.Unlock()
	s.log.Info("block leased by the masters", "overlay", k.overlay, "bridge", k.bridge, "block", lb.Prefix)
	if err := s.commits.Flush(b); err != nil {
		return fmt.Errorf("persist block: %w", err)
	}
	s.gossip.Announce()
	return nil
}
