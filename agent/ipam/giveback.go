package ipam

// The background work of growth: Run, and the return of idle blocks (a
// grant back to the donor through the ring, or a return to the masters).

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/carve-net/carve/agent/ipam/blockaddr"
	"github.com/carve-net/carve/agent/ipam/ipamstore"
	"github.com/carve-net/carve/agent/ipam/ipfamily"
	"github.com/carve-net/carve/agent/ipam/overlayspace"
	"github.com/carve-net/carve/ring"
)

// Run gives back idle blocks, reports grants and returns to the masters,
// releases the addresses of gone containers and warns of low space (watchHost),
// announces ring changes when gossip asks, and writes the rings that
// changed by other agents' entries, until ctx ends. As it returns it stops
// the growths and donations in flight and waits for them (Close).
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
	defer s.Close() // before the last ring write: a growth may still write
	var watch sync.WaitGroup
	defer watch.Wait()
	watch.Go(func() { s.watchHost(ctx) })
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			if s.grow.cfg.IdleReturn > 0 {
				s.returnIdle(time.Now())
			}
		case <-s.gossip.Kicked():
			s.gossip.Announce()
			continue
		case <-persistTicker.C:
			s.persistDirtyRings()
			continue
		case <-s.reports.Kicked():
		case <-retry.C:
		case <-usageTicker.C:
		}
		if wait := s.reports.Send(ctx, time.Now()); wait > 0 {
			retry.Reset(wait)
		}
	}
}

// watchHost, until ctx ends, releases the addresses of containers whose
// namespace is gone (when ReclaimConfig.After is set) and warns of
// overlays running out of space.
func (s *Service) watchHost(ctx context.Context) {
	warn := time.NewTicker(time.Minute)
	defer warn.Stop()
	var reclaim <-chan time.Time
	if s.reclaim.cfg.After > 0 {
		t := time.NewTicker(s.reclaim.missing.Every())
		defer t.Stop()
		reclaim = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-reclaim:
			s.reclaimGone(now)
		case now := <-warn.C:
			s.capacity.WarnLowSpace(now)
		}
	}
}

// returnIdle gives back the grown blocks that held no address for
// IdleReturn. Never a bridge's first block.
func (s *Service) returnIdle(now time.Time) {
	s.mu.Lock()
	var todo []*heldBlock
	for _, name := range sortedKeys(s.overlays) {
		o := s.overlays[name]
		for fam := range families {
			a := o.Alloc[fam]
			if a == nil {
				continue
			}
			for _, hb := range o.Blocks[fam] {
				if a.FreeHosts(hb.Prefix) != blockaddr.HostCount(hb.Prefix) {
					hb.IdleSince = time.Time{}
					continue
				}
				if hb.IdleSince.IsZero() {
					hb.IdleSince = now
				}
				if now.Sub(hb.IdleSince) >= s.grow.cfg.IdleReturn {
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
	if o == nil || o.Alloc[hb.Family] == nil || !slices.Contains(o.Blocks[hb.Family], hb) {
		s.mu.Unlock()
		return
	}
	a := o.Alloc[hb.Family]
	if a.FreeHosts(hb.Prefix) != blockaddr.HostCount(hb.Prefix) {
		s.mu.Unlock()
		return // taken meanwhile
	}
	var writes []write
	id := s.asker.RequestID()
	switch hb.Origin {
	case OriginGrant:
		to := blockaddr.LeaseOwner(a.Ring(), s.id, hb.Prefix)
		if to == "" {
			to = hb.Donor
		}
		if to == "" || to == s.id {
			s.mu.Unlock()
			return // nobody to give it back to: it stays
		}
		o.UnreserveGateway(hb.Family, hb.Prefix)
		var err error
		if s.tombstoned(to) {
			// The donor was deleted (and may be back with other space):
			// the block goes to nobody, as the masters free it.
			err = a.ReleaseBlock(hb.Prefix)
		} else {
			err = a.Grant(to, hb.Prefix)
		}
		if err != nil {
			o.ReserveGateways()
			s.mu.Unlock()
			level := slog.LevelWarn
			if errors.Is(err, ring.ErrNotLessee) {
				// Only the lessee's tokens count: it goes back once the
				// masters recorded the grant (the next tick tries again).
				level = slog.LevelDebug
			}
			s.log.Log(context.Background(), level, "an idle block could not go back to its donor", "overlay", hb.Overlay, "block", hb.Prefix, "donor", to, "err", err)
			return
		}
		// A return, not a grant: the masters give the block back to its
		// donor, merged into the block it came from (or free it when the
		// donor holds that no more), never as a block of its own.
		// It names the lease it gives back to the masters (LeaseVersion
		// and RestoreEpoch: they refuse it when a restore took the grant
		// back and the donor granted the block to this agent anew), but
		// keeps no Version of its own: a restart reads a return without
		// one as given back for any lease of the block (ipamstore.Load),
		// which a block back in its donor's ring must stay until the
		// masters take the return.
		enc := a.EncodeRing()
		writes = append(writes, putRing(hb.Overlay, hb.Family, enc),
			ipamstore.PutOutbox(ipamstore.OutboxEntry{Kind: ipamstore.OutboxReturn, Overlay: hb.Overlay, Prefix: hb.Prefix, RequestID: id,
				LeaseVersion: max(hb.Version, recordedVersion(s.view.Blocks, hb.Overlay, hb.Prefix)), RestoreEpoch: s.view.RestoreEpoch}))
	default:
		// The ring lets go of the block first (to nobody, so that a later
		// lease of another agent fills it), in the same commit as the
		// report the masters will free it on.
		o.UnreserveGateway(hb.Family, hb.Prefix)
		if err := a.ReleaseBlock(hb.Prefix); err != nil {
			o.ReserveGateways()
			s.mu.Unlock()
			s.log.Warn("an idle block could not be released in the ring", "overlay", hb.Overlay, "block", hb.Prefix, "err", err)
			return
		}
		// The version the masters' record lists the block at now, when it
		// is newer than the one held (a record re-versions its blocks, a
		// held block keeps the version it was taken at): a record that
		// lists it at no newer version is stale.
		version := max(hb.Version, recordedVersion(s.view.Blocks, hb.Overlay, hb.Prefix))
		s.grow.returned[hb.Prefix] = version
		enc := a.EncodeRing()
		writes = append(writes, putRing(hb.Overlay, hb.Family, enc), ipamstore.PutReturned(hb.Prefix, version),
			ipamstore.PutOutbox(ipamstore.OutboxEntry{Kind: ipamstore.OutboxReturn, Overlay: hb.Overlay, Prefix: hb.Prefix, RequestID: id,
				Version: version, RestoreEpoch: s.view.RestoreEpoch}))
	}
	o.Blocks[hb.Family] = slices.DeleteFunc(o.Blocks[hb.Family], func(x *heldBlock) bool { return x == hb })
	writes = append(writes, overlayspace.DeleteBlock(hb))
	b := s.commits.Enqueue(change{Writes: writes})
	s.mu.Unlock()
	if err := s.commits.Flush(b); err != nil {
		s.log.Error("persist the return of a block", "err", err)
		return
	}
	s.metrics.Returned.Inc()
	s.log.Info("idle block given back", "overlay", hb.Overlay, "bridge", hb.Bridge, "block", hb.Prefix, "origin", hb.Origin)
	s.gossip.Announce()
	s.reports.Kick()
	s.changed()
}

// forgetReturned drops the returns of o's blocks that a record of the
// masters newer than the returned lease no longer lists: the masters took
// them (a later lease of the same block has a higher version, and is this
// agent's again). Until then a record that lists one is stale, after a
// restart too (ipamstore.ReturnedBucket). The caller has quiesced.
func (s *Service) forgetReturned(o *overlay, v View) []write {
	if v.Self == nil {
		return nil
	}
	var writes []write
	for p, version := range s.grow.returned {
		u := o.Universe[ipfamily.Of(p.Addr())]
		if !u.IsValid() || !u.Contains(p.Addr()) || recordedBlock(v.Blocks, o.Name, p) {
			continue
		}
		if version != math.MaxUint64 && v.Self.Version <= version {
			continue // a record older than the lease given back
		}
		delete(s.grow.returned, p)
		writes = append(writes, ipamstore.DeleteReturned(p))
	}
	return writes
}

// recordedVersion is the version at which the masters' record lists the
// block p of overlay (0 when it does not).
func recordedVersion(blocks []MasterBlock, overlay string, p netip.Prefix) uint64 {
	for _, mb := range blocks {
		if mb.Overlay == overlay && mb.Prefix == p {
			return mb.Version
		}
	}
	return 0
}
