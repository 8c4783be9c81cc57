package ipam

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"slices"
	"time"

	"github.com/carve-net/carve/api"
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

// BlockSource is the masters' side of growth. The agent wires it to its
// masters' client; ipam knows nothing of HTTP or Raft.
type BlockSource interface {
	// Grow asks for another block for a bridge of an overlay (family 4 or
	// 6), committed before the answer. ErrMastersExhausted: the masters
	// have no free block left; any other error: no master answered.
	Grow(ctx context.Context, overlay, bridge string, family int, requestID string) (LeasedBlock, error)
	// Return gives a grown block back to the masters' free pool.
	Return(ctx context.Context, overlay string, prefix netip.Prefix, requestID string) error
	// ReportGrant tells the masters of a grant made through the ring, so
	// that they never lease that space to anyone else.
	ReportGrant(ctx context.Context, g GrantReport) error
}

// LeasedBlock is a block the masters leased on a grow request.
type LeasedBlock struct {
	Prefix netip.Prefix
	// Version is the Raft index of the lease (its version in the ring).
	Version uint64
	// Held, when set, are every block of the agent's record in the
	// overlay family, at Version (the record the grow answered): the
	// agent's complete lease set, seeded as such.
	Held []netip.Prefix
}

// GrantReport is a grant through the ring, as the masters learn it.
type GrantReport struct {
	Overlay   string
	Prefix    netip.Prefix
	Donor     string
	Recipient string
	// Bridge is the recipient's bridge the block serves ("": mesos).
	Bridge    string
	RequestID string
}

// MasterBlock is a grown or granted block the masters' record of this
// agent lists.
type MasterBlock struct {
	Overlay string
	Bridge  string
	Prefix  netip.Prefix
	Version uint64
	// Donor is the agent that granted the block; empty for a grown one.
	Donor string
}

// Errors of growth, for callers that branch.
var (
	// ErrMastersExhausted is BlockSource.Grow's answer when the masters have
	// no free block left for the overlay.
	ErrMastersExhausted = errors.New("the masters have no free block left")
	// errOverlayFull marks a growth that found space nowhere: not at the
	// masters, and no peer would grant any.
	errOverlayFull = errors.New("overlay full")
	// ErrReportRefused is a BlockSource's answer when the masters refused
	// a grant report or a return for good (not worth sending again).
	ErrReportRefused = errors.New("refused by the masters")
)

// GrowthConfig configures growth; the zero value grows through the ring only.
type GrowthConfig struct {
	// Source is the masters; nil: only peers are asked.
	Source BlockSource
	// LowWater is the number of free addresses of a bridge (per family)
	// below which it grows in the background; 0: max(2, 1/8 of its first
	// block); negative: only when an allocation finds it full.
	LowWater int
	// Wait bounds how long an allocation that finds its bridge full waits
	// for the growth in flight; 0: 10s.
	Wait time.Duration
	// IdleReturn is how long a grown block stays empty before it goes
	// back; 0: 10 minutes; negative: never.
	IdleReturn time.Duration
	// AnswerTimeout is how long a space request waits for an answer before
	// it is sent again (three sends per peer); 0: 1s.
	AnswerTimeout time.Duration
	// RefuseMemory is how long a peer that refused is not asked again; 0: 1m.
	RefuseMemory time.Duration
	// UsageInterval is the least time between two usage reports to the
	// masters (sent when the counts change; see usage.go); 0: 5s;
	// negative: none.
	UsageInterval time.Duration
	// UsageRefresh is the most time between two usage reports; 0: 1m.
	UsageRefresh time.Duration
	// Seed seeds the choice of the peer to ask; 0 draws one.
	Seed uint64
	// OnChange is called, without locks held, when blocks or rings changed
	// (the agent reconciles gateways and routes).
	OnChange func()
}

// growKey names a growth in flight.
type growKey struct {
	overlay, bridge string
	fam             int
}

// growth is one growth in flight; done closes when it ends with err.
type growth struct {
	done chan struct{}
	err  error
}

// waiter is a space request waiting for its answer.
type waiter struct {
	peer string
	ch   chan spaceMessage
}

// growState is the growth part of a Service, under s.mu.
type growState struct {
	cfg      GrowthConfig
	rng      *rand.Rand
	inflight map[growKey]*growth
	// asking: the bridge an overlay family asks space for now.
	asking  map[[2]string]string
	waiting map[string]waiter
	refused map[[2]string]time.Time // overlay, peer -> when
	granted map[[2]string]netip.Prefix
	// returned: grown blocks given back, by prefix, with their lease
	// version: a masters' record that still lists one is stale.
	returned map[netip.Prefix]uint64
	kick     chan struct{}
	usage    usageState // Run's alone
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
		cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 0x6772)),
		inflight: map[growKey]*growth{}, asking: map[[2]string]string{}, waiting: map[string]waiter{},
		refused: map[[2]string]time.Time{}, granted: map[[2]string]netip.Prefix{},
		returned: map[netip.Prefix]uint64{}, kick: make(chan struct{}, 1),
	}
}

// growTimeout bounds one growth (the masters, then a few peers).
const growTimeout = 30 * time.Second

// maxPeersAsked is how many peers one growth asks before it gives up.
const maxPeersAsked = 3

// Allocate gives an attachment its addresses (the same ones on a repeat),
// once they are on disk. A bridge that is full waits (bounded) for the
// growth it starts; one that falls below its low-water mark grows in the
// background.
func (s *Service) Allocate(req api.IPAMRequest) (*api.Allocation, error) {
	if err := validateRequest(&req); err != nil {
		return nil, failure(http.StatusBadRequest, api.CodeBadRequest, "%v", err)
	}
	a, err := s.allocate(req)
	if isExhausted(err) {
		gs := s.startGrowth(req.Network, req.Bridge, true)
		var growErrs []error
		if len(gs) > 0 {
			timer := time.NewTimer(s.grow.cfg.Wait)
			for _, g := range gs {
				select {
				case <-g.done:
					growErrs = append(growErrs, g.err)
				case <-timer.C:
					growErrs = append(growErrs, errors.New("still growing: try again"))
				}
			}
			timer.Stop()
			a, err = s.allocate(req)
		}
		if isExhausted(err) {
			s.metrics.exhausted.Inc()
			full := err.(*api.Error)
			if gerr := errors.Join(growErrs...); gerr != nil {
				if errors.Is(gerr, errOverlayFull) {
					return nil, failure(http.StatusConflict, api.CodeExhausted, "overlay %q is full: %s, and no master or peer has space left (%v)", req.Network, full.Message, gerr)
				}
				return nil, failure(http.StatusConflict, api.CodeExhausted, "%s; no more space: %v", full.Message, gerr)
			}
			return nil, err
		}
	}
	if err == nil {
		s.startGrowth(req.Network, req.Bridge, false)
	}
	return a, err
}

func isExhausted(err error) bool {
	var ae *api.Error
	return errors.As(err, &ae) && ae.Code == api.CodeExhausted
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
		s.grow.inflight[k] = g
		out = append(out, g)
		go s.runGrowth(k, g)
	}
	return out
}

func (s *Service) runGrowth(k growKey, g *growth) {
	ctx, cancel := context.WithTimeout(context.Background(), growTimeout)
	defer cancel()
	err := s.growOnce(ctx, k)
	if err != nil {
		s.log.Warn("a bridge could not grow", "overlay", k.overlay, "bridge", k.bridge, "family", familyName(k.fam), "err", err)
	}
	s.mu.Lock()
	delete(s.grow.inflight, k)
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

// growOnce gets one block: from the masters, else from a peer.
func (s *Service) growOnce(ctx context.Context, k growKey) error {
	if src := s.grow.cfg.Source; src != nil {
		lb, err := src.Grow(ctx, k.overlay, k.bridge, familyNumber(k.fam), s.requestID())
		switch {
		case err == nil:
			if err = s.addGrownBlock(k, lb); err == nil {
				s.metrics.grows.WithLabelValues("master", "ok").Inc()
				return nil
			}
			s.metrics.grows.WithLabelValues("master", "error").Inc()
			s.log.Error("the masters' block could not be used", "overlay", k.overlay, "block", lb.Prefix, "err", err)
		case errors.Is(err, ErrMastersExhausted):
			s.metrics.grows.WithLabelValues("master", "exhausted").Inc()
			s.metrics.refused.WithLabelValues("masters_exhausted").Inc()
		default:
			s.metrics.grows.WithLabelValues("master", "unreachable").Inc()
			s.log.Warn("no master answered a grow request: asking a peer", "overlay", k.overlay, "err", err)
		}
	}
	return s.growFromRing(ctx, k)
}

// familyNumber is 4 or 6.
func familyNumber(fam int) int {
	if fam == 1 {
		return 6
	}
	return 4
}

// requestID is a fresh id for a request to the masters or a peer.
func (s *Service) requestID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("%s-%016x", s.id, s.grow.rng.Uint64())
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
	b := s.enqueue(change{writes: []write{putBlock(hb), putRing(k.overlay, k.fam, enc)}})
	s.mu.Unlock()
	s.log.Info("block leased by the masters", "overlay", k.overlay, "bridge", k.bridge, "block", lb.Prefix)
	if err := s.flush(b); err != nil {
		return fmt.Errorf("persist block: %w", err)
	}
	s.announce()
	return nil
}

// learnMasterBlocks adds the grown blocks the masters' record lists that
// this agent does not hold (after a lost data dir). The caller has quiesced.
func (s *Service) learnMasterBlocks(o *overlay, v View, b *batch) {
	for _, mb := range v.Blocks {
		if mb.Overlay != o.name || !mb.Prefix.IsValid() {
			continue
		}
		fam := familyOf(mb.Prefix.Addr())
		if o.held(fam, mb.Prefix) != nil || mb.Version <= s.grow.returned[mb.Prefix] {
			continue
		}
		if _, ok := o.bridges[mb.Bridge]; !ok || !o.universe[fam].IsValid() {
			continue
		}
		if _, inside := overlapsAny(o.firstBlocks(fam), mb.Prefix); inside {
			// A block this agent granted and got back, which the masters
			// record as a grant to it: it is part of a first block.
			continue
		}
		hb := &heldBlock{Overlay: o.name, Family: fam, Bridge: mb.Bridge, Prefix: mb.Prefix, Origin: OriginGrow, Version: mb.Version}
		if mb.Donor != "" {
			hb.Origin, hb.Donor, hb.Version = OriginGrant, mb.Donor, 0
		}
		o.blocks[fam] = append(o.blocks[fam], hb)
		slices.SortFunc(o.blocks[fam], func(x, y *heldBlock) int { return x.Prefix.Addr().Compare(y.Prefix.Addr()) })
		b.add(change{writes: []write{putBlock(hb)}})
	}
}

// refusedError is a peer's refusal to grant space.
type refusedError struct{ peer, reason string }

func (e *refusedError) Error() string { return fmt.Sprintf("peer %s refused: %s", e.peer, e.reason) }

// growFromRing asks peers for a block, the ones with most free space most
// likely, leaving out those that refused recently.
func (s *Service) growFromRing(ctx context.Context, k growKey) error {
	if k.fam == 1 {
		// Peers do not grant IPv6 space (reasonIPv6NotGranted).
		s.metrics.grows.WithLabelValues("ring", "none").Inc()
		return fmt.Errorf("%w: IPv6 space is leased by the masters only, never granted through the ring", errOverlayFull)
	}
	var errs []error
	for range maxPeersAsked {
		s.mu.Lock()
		o := s.overlays[k.overlay]
		if o == nil || o.alloc[k.fam] == nil || s.channel == nil {
			s.mu.Unlock()
			return errors.Join(append(errs, errors.New("no ring channel to ask peers on"))...)
		}
		exclude := []string{s.id}
		for key, when := range s.grow.refused {
			if key[0] == k.overlay && time.Since(when) < s.grow.cfg.RefuseMemory {
				exclude = append(exclude, key[1])
			}
		}
		peer, ok := o.alloc[k.fam].Ring().ChoosePeerToAsk(s.grow.rng, exclude...)
		bits := o.bridges[k.bridge][k.fam].Bits()
		s.mu.Unlock()
		if !ok {
			s.metrics.grows.WithLabelValues("ring", "none").Inc()
			return fmt.Errorf("%w: no peer has free space to ask for (%d refused recently)", errOverlayFull, len(exclude)-1)
		}
		err := s.askPeer(ctx, peer, k, bits)
		if err == nil {
			s.metrics.grows.WithLabelValues("ring", "ok").Inc()
			return nil
		}
		errs = append(errs, err)
		reason := "no_answer"
		var re *refusedError
		if errors.As(err, &re) {
			reason = re.reason
		}
		s.metrics.refused.WithLabelValues(reason).Inc()
		s.metrics.grows.WithLabelValues("ring", "refused").Inc()
		s.mu.Lock()
		s.grow.refused[[2]string{k.overlay, peer}] = time.Now()
		s.mu.Unlock()
		if ctx.Err() != nil {
			break
		}
	}
	return fmt.Errorf("%w: %w", errOverlayFull, errors.Join(errs...))
}

// askingBridge is the bridge an overlay family asks space for now (mesos
// when none). The caller holds s.mu.
func (s *Service) askingBridge(overlay string, fam int) string {
	if b, ok := s.grow.asking[[2]string{overlay, familyName(fam)}]; ok {
		return b
	}
	return api.BridgeMesos
}

// askPeer sends a space request to peer, resending it until it is answered;
// the grant counts once the merged ring gives this agent the block.
func (s *Service) askPeer(ctx context.Context, peer string, k growKey, bits int) error {
	id := s.requestID()
	ch := make(chan spaceMessage, 1)
	s.mu.Lock()
	s.grow.waiting[id] = waiter{peer: peer, ch: ch}
	s.grow.asking[[2]string{k.overlay, familyName(k.fam)}] = k.bridge
	channel, clusterID := s.channel, s.clusterID
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.grow.waiting, id)
		delete(s.grow.asking, [2]string{k.overlay, familyName(k.fam)})
		s.mu.Unlock()
	}()
	msg := encodeSpaceMessage(spaceMessage{V: spaceVersion, Kind: kindRequest, ClusterID: clusterID, From: s.id, ID: id,
		Overlay: k.overlay, Family: familyName(k.fam), Bits: bits})
	for range 3 {
		if err := channel.Unicast(peer, msg); err != nil {
			return fmt.Errorf("ask %s: %w", peer, err)
		}
		timer := time.NewTimer(s.grow.cfg.AnswerTimeout)
		select {
		case ans := <-ch:
			timer.Stop()
			return s.acceptAnswer(k, peer, ans)
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
	}
	return fmt.Errorf("peer %s did not answer", peer)
}

// acceptAnswer merges a grant's ring; the block counts only if the ring
// then gives it to this agent. A grant is reported to the masters.
func (s *Service) acceptAnswer(k growKey, peer string, ans spaceMessage) error {
	if ans.Kind == kindRefuse {
		return &refusedError{peer: peer, reason: ans.Reason}
	}
	p, _ := netip.ParsePrefix(ans.Prefix) // validated
	s.mu.Lock()
	deleted := s.tombstoned(peer)
	s.mu.Unlock()
	if deleted {
		// Obligation 2 (docs/design.md): no grant from a deleted donor.
		return &refusedError{peer: peer, reason: "donor_deleted"}
	}
	if _, err := s.mergeRings(ringMessage{ClusterID: ans.ClusterID, Rings: []ringEntry{{Overlay: k.overlay, Family: ans.Family, Ring: ans.Ring}}}); err != nil {
		return &refusedError{peer: peer, reason: "bad_ring: " + err.Error()}
	}
	s.mu.Lock()
	o := s.overlays[k.overlay]
	var hb *heldBlock
	if o != nil {
		hb = o.held(k.fam, p)
	}
	if hb == nil || !hb.Prefix.Contains(p.Addr()) {
		s.mu.Unlock()
		return &refusedError{peer: peer, reason: fmt.Sprintf("bad_grant: the ring does not give %s to this agent", p)}
	}
	b := s.enqueue(change{writes: []write{putOutbox(outboxEntry{Kind: outboxGrant, Overlay: k.overlay, Prefix: hb.Prefix,
		Donor: peer, Recipient: s.id, Bridge: hb.Bridge, RequestID: ans.ID})}})
	s.mu.Unlock()
	s.metrics.grantsReceived.Inc()
	if err := s.flush(b); err != nil {
		s.log.Error("persist the report of a grant", "err", err)
	}
	s.kickOutbox()
	return nil
}

// Run gives back idle blocks, reports grants and returns to the masters,
// announces ring changes when gossip asks, and writes the rings that
// changed by other agents' entries, until ctx ends.
func (s *Service) Run(ctx context.Context) {
	tick := s.grow.cfg.IdleReturn / 4
	if tick <= 0 || tick > time.Minute {
		tick = time.Minute
	}
	tick = max(tick, 10*time.Millisecond)
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	usageEvery := s.grow.cfg.UsageInterval
	if usageEvery <= 0 {
		usageEvery = time.Hour
	}
	usageTicker := time.NewTicker(usageEvery)
	defer usageTicker.Stop()
	persistTicker := time.NewTicker(ringPersistEvery)
	defer persistTicker.Stop()
	defer s.persistDirtyRings()
	backoff := newOutboxBackoff()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			if s.grow.cfg.IdleReturn > 0 {
				s.returnIdle(time.Now())
			}
		case <-s.announceKick:
			s.announce()
			continue
		case <-persistTicker.C:
			s.persistDirtyRings()
			continue
		case <-s.grow.kick:
		case <-retry.C:
		case <-usageTicker.C:
		}
		// Grants go to the masters before a usage report lists them.
		if err := s.flushOutbox(ctx); err != nil {
			retry.Reset(backoff.Next())
			continue
		}
		backoff.Reset()
		if err := s.sendUsage(ctx, time.Now()); err != nil {
			s.log.Debug("usage report to the masters", "err", err)
		}
	}
}

// hostCount is how many addresses of a block Allocate may hand out.
func hostCount(p netip.Prefix) ring.Uint128 {
	n := ring.U128(1).Lsh(uint(p.Addr().BitLen() - p.Bits())).Sub(ring.U128(2))
	if p.Addr().Is4() {
		n = n.Sub(ring.U128(1))
	}
	return n
}

// returnIdle gives back the grown blocks that held no address for
// IdleReturn. Never a bridge's first block.
func (s *Service) returnIdle(now time.Time) {
	s.mu.Lock()
	var todo []*heldBlock
	for _, name := range sortedKeys(s.overlays) {
		o := s.overlays[name]
		for fam := range families {
			a := o.alloc[fam]
			if a == nil {
				continue
			}
			for _, hb := range o.blocks[fam] {
				if a.FreeHosts(hb.Prefix) != hostCount(hb.Prefix) {
					hb.idleSince = time.Time{}
					continue
				}
				if hb.idleSince.IsZero() {
					hb.idleSince = now
				}
				if now.Sub(hb.idleSince) >= s.grow.cfg.IdleReturn {
					todo = append(todo, hb)
				}
			}
		}
	}
	s.mu.Unlock()
	for _, hb := range todo {
		s.giveBack(hb)
	}
}

// giveBack returns one idle block: a grant back to its donor through the
// ring, or to the masters through the outbox.
func (s *Service) giveBack(hb *heldBlock) {
	s.mu.Lock()
	o := s.overlays[hb.Overlay]
	if o == nil || o.alloc[hb.Family] == nil || !slices.Contains(o.blocks[hb.Family], hb) {
		s.mu.Unlock()
		return
	}
	a := o.alloc[hb.Family]
	if a.FreeHosts(hb.Prefix) != hostCount(hb.Prefix) {
		s.mu.Unlock()
		return // taken meanwhile
	}
	var writes []write
	id := fmt.Sprintf("%s-%016x", s.id, s.grow.rng.Uint64())
	switch hb.Origin {
	case OriginGrant:
		to := s.leaseOwner(a.Ring(), hb.Prefix)
		if to == "" {
			to = hb.Donor
		}
		if to == "" || to == s.id {
			s.mu.Unlock()
			return // nobody to give it back to: it stays
		}
		o.unreserveGateway(hb.Family, hb.Prefix)
		if err := a.Grant(to, hb.Prefix); err != nil {
			o.reserveGateways()
			s.mu.Unlock()
			s.log.Warn("an idle block could not go back to its donor", "overlay", hb.Overlay, "block", hb.Prefix, "donor", to, "err", err)
			return
		}
		enc := a.EncodeRing()
		writes = append(writes, putRing(hb.Overlay, hb.Family, enc),
			putOutbox(outboxEntry{Kind: outboxGrant, Overlay: hb.Overlay, Prefix: hb.Prefix, Donor: s.id, Recipient: to, RequestID: id}))
	default:
		// The ring lets go of the block first (to nobody, so that a later
		// lease of another agent fills it), in the same commit as the
		// report the masters will free it on.
		o.unreserveGateway(hb.Family, hb.Prefix)
		if err := a.ReleaseBlock(hb.Prefix); err != nil {
			o.reserveGateways()
			s.mu.Unlock()
			s.log.Warn("an idle block could not be released in the ring", "overlay", hb.Overlay, "block", hb.Prefix, "err", err)
			return
		}
		s.grow.returned[hb.Prefix] = hb.Version
		enc := a.EncodeRing()
		writes = append(writes, putRing(hb.Overlay, hb.Family, enc),
			putOutbox(outboxEntry{Kind: outboxReturn, Overlay: hb.Overlay, Prefix: hb.Prefix, RequestID: id}))
	}
	o.blocks[hb.Family] = slices.DeleteFunc(o.blocks[hb.Family], func(x *heldBlock) bool { return x == hb })
	writes = append(writes, deleteBlock(hb))
	b := s.enqueue(change{writes: writes})
	s.mu.Unlock()
	if err := s.flush(b); err != nil {
		s.log.Error("persist the return of a block", "err", err)
		return
	}
	s.metrics.returned.Inc()
	s.log.Info("idle block given back", "overlay", hb.Overlay, "bridge", hb.Bridge, "block", hb.Prefix, "origin", hb.Origin)
	s.announce()
	s.kickOutbox()
	s.changed()
}
