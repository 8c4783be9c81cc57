package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"time"

	"github.com/carve-net/carve/agent/ipam/blockaddr"
	"github.com/carve-net/carve/agent/ipam/growth"
	"github.com/carve-net/carve/agent/ipam/ipamvalidate"
	"github.com/carve-net/carve/agent/ipam/ipfamily"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
)

// Allocate gives an attachment its addresses (the same ones on a repeat),
// once they are on disk. A bridge that is full waits (bounded) for the
// growth it starts; one that falls below its low-water mark grows in the
// background.
func (s *Service) Allocate(req api.IPAMRequest) (*api.Allocation, error) {
	if err := ipamvalidate.Request(&req); err != nil {
		return nil, failure(http.StatusBadRequest, api.CodeBadRequest, "%v", err)
	}
	a, err := s.allocate(req)
	if isExhausted(err) {
		// A growth this ADD waits for may have started before (low water)
		// and its block gone to another ADD meanwhile: while every growth
		// ends well and the bridge is still full, grow again (within Wait;
		// each round some ADD takes what it brought).
		var growErrs []error
		// One bound for the whole wait, whatever the number of growths
		// (a dual-stack bridge grows both families) and rounds.
		wait, cancel := context.WithTimeout(context.Background(), s.grow.cfg.Wait)
		for round := 0; isExhausted(err) && len(growErrs) == 0; round++ {
			gs := s.startGrowth(req.Network, req.Bridge, true)
			if len(gs) == 0 && round > 0 {
				break
			}
			growErrs = s.grower.Wait(wait, gs)
			// Again even when no growth is in flight: one may have
			// ended since the first try, leaving space (startGrowth
			// found it).
			a, err = s.allocate(req)
		}
		cancel()
		if isExhausted(err) {
			full := err.(*api.Error)
			gerr := errors.Join(growErrs...)
			if errors.Is(gerr, errStopping) {
				// Not exhausted: the agent is stopping, and the
				// runtime retries once it is back.
				return nil, failure(http.StatusServiceUnavailable, api.CodeNotReady, "%s, and it cannot grow now: %v", full.Message, errStopping)
			}
			s.metrics.Exhausted.Inc()
			if gerr != nil {
				if errors.Is(gerr, ErrQuota) {
					// The masters' answer names the cap and the fix.
					why, me := gerr.Error(), (*api.Error)(nil)
					if errors.As(gerr, &me) {
						why = me.Message
					}
					return nil, failure(http.StatusConflict, api.CodeQuota, "%s, and this agent is at its quota of overlay %q: %s", full.Message, req.Network, why)
				}
				if errors.Is(gerr, errOverlayFull) {
					return nil, failure(http.StatusConflict, api.CodeExhausted, "overlay %q is full: %s, and no master or peer has space left (%v): release the addresses of containers that are gone, or add an overlay with a new subnet (carve config apply; a leased overlay's subnet never changes)", req.Network, full.Message, gerr)
				}
				if errors.Is(gerr, errNoDonor) {
					// Not full: peers hold free addresses, but none gave
					// a block within Wait.
					return nil, failure(http.StatusConflict, api.CodeExhausted, "%s, and no peer granted space within %s although peers report free addresses (%v): a peer keeps at least as much as it gives and grants blocks of at least 4 addresses, so release the addresses of containers that are gone or add an overlay with a new subnet (carve config apply); a peer that did not answer may be cut off from this host (carve cluster status)", full.Message, s.grow.cfg.Wait, gerr)
				}
				if errors.Is(gerr, growth.ErrStillGrowing) {
					// Not full: the growth goes on, and the runtime may
					// retry once it brought space.
					return nil, failure(http.StatusConflict, api.CodeExhausted, "%s, and no space came within %s: %v", full.Message, s.grow.cfg.Wait, gerr)
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

// isExhausted tells whether err is an exhausted answer (a full bridge).
func isExhausted(err error) bool {
	var ae *api.Error
	return errors.As(err, &ae) && ae.Code == api.CodeExhausted
}

// allocate decides under the lock, then waits for the decision to be durable.
func (s *Service) allocate(req api.IPAMRequest) (*api.Allocation, error) {
	out, b, err := s.decideAllocation(req)
	if err != nil || b == nil {
		return out, err
	}
	if err := s.commits.Flush(b); err != nil {
		return nil, failure(http.StatusInternalServerError, api.CodeInternal, "persist allocation: %v", err)
	}
	s.metrics.Ops.WithLabelValues("allocate").Inc()
	return out, nil
}

// decideAllocation returns the attachment's addresses and the batch that
// makes them durable (nil when they already are).
func (s *Service) decideAllocation(req api.IPAMRequest) (*api.Allocation, *batch, error) {
	at := ring.Attachment{ContainerID: req.ContainerID, Interface: req.IfName}
	key := allocKey(req.Network, at)
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.commits.WaitPending(key) {
	}
	o, err := s.overlayFor(req.Network, true)
	if err != nil {
		return nil, nil, err
	}
	if rec, ok := o.Attached[at]; ok {
		if rec.Bridge != req.Bridge {
			return nil, nil, failure(http.StatusConflict, api.CodeConflict, "%s/%s already holds addresses on the %s bridge", at.ContainerID, at.Interface, rec.Bridge)
		}
		claims, _ := ipamvalidate.RequestedAddrs(req) // validated
		for fam, c := range claims {
			if c.IsValid() && rec.Addr(fam) != c {
				return nil, nil, failure(http.StatusConflict, api.CodeConflict, "%s/%s already holds %s, not the requested %s (release it first)", at.ContainerID, at.Interface, rec.Addr(fam), c)
			}
		}
		return s.render(o, at, rec), nil, nil
	}
	if _, ok := o.Bridges[req.Bridge]; !ok {
		return nil, nil, failure(http.StatusBadRequest, api.CodeBadRequest, "this agent has no %s bridge on %q (see --%s-bridge)", req.Bridge, req.Network, req.Bridge)
	}
	rec, err := take(o, at, req)
	if err != nil {
		return nil, nil, err
	}
	o.Attached[at] = rec
	writes := []write{putAlloc(o.Name, at, rec)}
	if s.released.forget(key) {
		writes = append(writes, deleteReleased(key))
	}
	b := s.commits.Enqueue(change{Key: key, Writes: writes, Undo: func() { forget(o, at) }})
	return s.render(o, at, rec), b, nil
}

// take allocates (or claims) the attachment's address in each family the
// request and the bridge have, from the bridge's blocks in order (its first
// sub-subnet, then those it grew); a requested address is given exactly or
// not at all; on failure nothing stays taken.
func take(o *overlay, at ring.Attachment, req api.IPAMRequest) (allocRecord, error) {
	claims, _ := ipamvalidate.RequestedAddrs(req) // validated
	rec := allocRecord{Bridge: req.Bridge, Owner: req.Owner}
	for fam := range families {
		alloc, blocks := o.Alloc[fam], o.BridgeBlocks(req.Bridge, fam)
		claim := claims[fam]
		if claim.IsValid() && (alloc == nil || len(blocks) == 0 || (req.Family != "" && req.Family != ipfamily.Name(fam))) {
			forget(o, at)
			return allocRecord{}, failure(http.StatusBadRequest, api.CodeBadRequest, "requested address %s: the %s bridge of %q has no IPv%d range", claim, req.Bridge, req.Network, 4+2*fam)
		}
		if alloc == nil || len(blocks) == 0 || (req.Family != "" && req.Family != ipfamily.Name(fam)) {
			continue
		}
		var addr netip.Addr
		var err error
		if claim.IsValid() {
			if !slices.ContainsFunc(blocks, func(p netip.Prefix) bool { return p.Contains(claim) }) {
				err = fmt.Errorf("%w: %s is outside the %s bridge's %s", ring.ErrNotOwned, claim, req.Bridge, blockaddr.Describe(blocks))
			} else if p, edge := blockaddr.BridgeAddressOf(blocks, claim); edge {
				err = blockaddr.BridgeAddressError(claim, req.Bridge, p)
			} else if err = alloc.Claim(at, claim); err == nil {
				addr = claim
			}
		} else {
			addr, err = blockaddr.AllocateHost(alloc, at, blocks)
		}
		if err != nil {
			forget(o, at)
			return allocRecord{}, claimError(o, fam, err, req, blockaddr.Describe(blocks), claim)
		}
		rec.SetAddr(fam, addr)
	}
	if rec.Empty() {
		return allocRecord{}, failure(http.StatusBadRequest, api.CodeBadRequest, "no address family to allocate from on %q (family %q)", req.Network, req.Family)
	}
	return rec, nil
}

// claimError is allocError with, for a requested address, who has it: the
// container that holds it, or the agent whose space it is.
func claimError(o *overlay, fam int, err error, req api.IPAMRequest, subnet string, claim netip.Addr) error {
	if !claim.IsValid() {
		return allocError(err, req.Bridge, subnet, claim)
	}
	switch {
	case errors.Is(err, ring.ErrAddressInUse):
		holder := "a reserved address of the bridge"
		if at, ok := o.Alloc[fam].Holder(claim); ok {
			holder = "container " + at.ContainerID + " interface " + at.Interface
			if rec, ok := o.Attached[at]; ok && !rec.Owner.Empty() {
				holder = rec.Owner.String()
			}
		}
		return failure(http.StatusConflict, api.CodeTaken, "requested address %s is taken by %s (carve ipam show --ip %s)", claim, holder, claim)
	case errors.Is(err, blockaddr.ErrBridgeAddress):
		return failure(http.StatusConflict, api.CodeBridgeAddress, "%v", err)
	case errors.Is(err, ring.ErrNotOwned), errors.Is(err, ring.ErrOutside):
		if !o.Universe[fam].Contains(claim) {
			return failure(http.StatusConflict, api.CodeNotOwned, "requested address %s is outside overlay %q (%s)", claim, o.Name, o.Universe[fam])
		}
		peer, _ := o.Alloc[fam].Ring().Owner(claim)
		switch peer {
		case o.Alloc[fam].Self():
			return failure(http.StatusConflict, api.CodeNotOwned, "requested address %s is this agent's, but not in its %s bridge's %s (another bridge's range: ask on the network of that bridge)", claim, req.Bridge, subnet)
		case "":
			return failure(http.StatusConflict, api.CodeNotOwned, "requested address %s is not this host's: no agent holds it in the ring of %q yet", claim, o.Name)
		}
		return failure(http.StatusConflict, api.CodeNotOwned, "requested address %s is not this host's: agent %s holds it in overlay %q (run the container on that host, or let carve choose; this host's %s bridge has %s)", claim, peer, o.Name, req.Bridge, subnet)
	}
	return allocError(err, req.Bridge, subnet, claim)
}

func allocError(err error, bridge string, subnet string, claim netip.Addr) error {
	switch {
	case errors.Is(err, blockaddr.ErrBridgeAddress):
		return failure(http.StatusConflict, api.CodeConflict, "%v", err)
	case errors.Is(err, ring.ErrFull):
		return failure(http.StatusConflict, api.CodeExhausted, "exhausted: the %s bridge's %s has no free address", bridge, subnet)
	case errors.Is(err, ring.ErrAddressInUse):
		return failure(http.StatusConflict, api.CodeTaken, "address %s is held by another container", claim)
	case errors.Is(err, ring.ErrNotOwned), errors.Is(err, ring.ErrOutside):
		return failure(http.StatusConflict, api.CodeConflict, "address %s is not this agent's to give: %v", claim, err)
	default:
		return failure(http.StatusInternalServerError, api.CodeInternal, "allocate in %s: %v", subnet, err)
	}
}

// forget frees an attachment's addresses at once: the undo of an
// allocation that never became durable.
func forget(o *overlay, at ring.Attachment) {
	for _, alloc := range o.Alloc {
		if alloc != nil {
			alloc.Release(at)
		}
	}
	delete(o.Attached, at)
}

// release frees an attachment and queues the deletion of its record. Its
// addresses stay reserved until the deletion is durable (see package groupcommit).
// The caller holds s.mu and flushes the batch.
func (s *Service) release(o *overlay, at ring.Attachment) *batch {
	key, now := allocKey(o.Name, at), time.Now()
	writes := []write{deleteAlloc(o.Name, at)}
	for _, k := range s.released.prune(now) {
		writes = append(writes, deleteReleased(k))
	}
	writes = append(writes, putReleased(key, now))
	s.released.mark(key, now)
	rec := o.Attached[at]
	delete(o.Attached, at)
	var held [families]netip.Addr
	for fam, alloc := range o.Alloc {
		if alloc == nil {
			continue
		}
		if addr, ok := alloc.Release(at); ok {
			if err := alloc.Reserve(addr); err != nil {
				// Cannot happen (the address is owned and was just freed);
				// if it did, the address is free at once, as before group commit.
				s.log.Error("reserve a released address until its release is durable", "overlay", o.Name, "addr", addr, "err", err)
				continue
			}
			held[fam] = addr
		}
	}
	return s.commits.Enqueue(change{
		Key:    key,
		Writes: writes,
		Durable: func() {
			for fam, addr := range held {
				if addr.IsValid() {
					s.forgetNeighbour(o.Name, rec.Bridge, addr) // before anyone can get it
					o.Alloc[fam].Unreserve(addr)
				}
			}
		},
		Undo: func() {
			for fam, addr := range held {
				if addr.IsValid() {
					o.Alloc[fam].Unreserve(addr)
					if err := o.Alloc[fam].Claim(at, addr); err != nil {
						s.log.Error("take back a release that did not commit", "overlay", o.Name, "addr", addr, "err", err)
					}
				}
			}
			o.Attached[at] = rec
		},
	})
}

// Release frees an attachment's addresses; releasing nothing succeeds.
func (s *Service) Release(req api.IPAMRequest) (*api.Released, error) {
	if err := ipamvalidate.Request(&req); err != nil {
		return nil, failure(http.StatusBadRequest, api.CodeBadRequest, "%v", err)
	}
	out, b := s.decideRelease(req)
	if b == nil {
		return out, nil
	}
	if err := s.commits.Flush(b); err != nil {
		return nil, failure(http.StatusInternalServerError, api.CodeInternal, "persist release: %v", err)
	}
	s.metrics.Ops.WithLabelValues("release").Inc()
	s.drainedNow(req.Network)
	return out, nil
}

func (s *Service) decideRelease(req api.IPAMRequest) (*api.Released, *batch) {
	at := ring.Attachment{ContainerID: req.ContainerID, Interface: req.IfName}
	key := allocKey(req.Network, at)
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.commits.WaitPending(key) {
	}
	// Whatever it releases (maybe nothing, after a lost data dir), a DEL
	// answered OK is one the runtime will not send again.
	s.released.mark(key, time.Now())
	out := &api.Released{Released: []api.Allocation{}}
	if o := s.overlays[req.Network]; o != nil {
		if rec, ok := o.Attached[at]; ok {
			out.Released = append(out.Released, *s.render(o, at, rec))
			return out, s.release(o, at)
		}
	}
	// Not claimed (the overlay is not configured, or the address was not
	// claimable): drop the persisted record so that it is not claimed later.
	rec, ok := s.persist[req.Network][at]
	if !ok {
		return out, nil
	}
	delete(s.persist[req.Network], at)
	out.Released = append(out.Released, api.Allocation{Network: req.Network, ContainerID: at.ContainerID, IfName: at.Interface, Bridge: rec.Bridge})
	return out, s.commits.Enqueue(change{Key: key, Writes: []write{deleteAlloc(req.Network, at)}, Undo: func() {
		if s.persist[req.Network] == nil {
			s.persist[req.Network] = map[ring.Attachment]allocRecord{}
		}
		s.persist[req.Network][at] = rec
	}})
}

// ReleaseAddress frees whichever attachment holds addr on the network
// (Docker's ReleaseAddress names only the address). An address nobody holds
// is no error: Docker also releases gateways it never asked us for.
func (s *Service) ReleaseAddress(network string, addr netip.Addr) (*api.Released, error) {
	out, b := s.decideReleaseAddress(network, addr)
	if b == nil {
		return out, nil
	}
	if err := s.commits.Flush(b); err != nil {
		return nil, failure(http.StatusInternalServerError, api.CodeInternal, "persist release: %v", err)
	}
	s.metrics.Ops.WithLabelValues("release").Add(float64(len(out.Released)))
	s.drainedNow(network)
	return out, nil
}

func (s *Service) decideReleaseAddress(network string, addr netip.Addr) (*api.Released, *batch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := &api.Released{Released: []api.Allocation{}}
	for {
		o := s.overlays[network]
		if o == nil {
			return out, nil
		}
		var holders []ring.Attachment
		busy := ""
		for _, at := range sortedAttachments(o.Attached) {
			if rec := o.Attached[at]; rec.V4 != addr && rec.V6 != addr {
				continue
			}
			if key := allocKey(network, at); s.commits.Pending(key) {
				busy = key
				break
			}
			holders = append(holders, at)
		}
		if busy != "" {
			s.commits.WaitPending(busy) // lets s.mu go: look again
			continue
		}
		var b *batch
		for _, at := range holders {
			out.Released = append(out.Released, *s.render(o, at, o.Attached[at]))
			b = s.release(o, at)
		}
		return out, b
	}
}

// GC releases every allocation of the network whose attachment is not kept,
// in one commit. Attachments with a change in flight are left alone: they
// are being allocated or released right now.
func (s *Service) GC(req api.GCRequest) (*api.Released, error) {
	if err := ipamvalidate.GC(req); err != nil {
		return nil, failure(http.StatusBadRequest, api.CodeBadRequest, "%v", err)
	}
	keep := map[ring.Attachment]bool{}
	keepAll := map[string]bool{}
	for _, k := range req.Keep {
		if k.IfName == "" {
			keepAll[k.ContainerID] = true
		}
		keep[ring.Attachment{ContainerID: k.ContainerID, Interface: k.IfName}] = true
	}
	out, b := s.decideGC(req, func(at ring.Attachment) bool { return keep[at] || keepAll[at.ContainerID] })
	if b == nil {
		return out, nil
	}
	if err := s.commits.Flush(b); err != nil {
		return nil, failure(http.StatusInternalServerError, api.CodeInternal, "persist gc: %v", err)
	}
	s.log.Info("gc released stale allocations", "network", req.Network, "count", len(out.Released))
	s.drainedNow(req.Network)
	s.metrics.Ops.WithLabelValues("gc_release").Add(float64(len(out.Released)))
	return out, nil
}

func (s *Service) decideGC(req api.GCRequest, kept func(ring.Attachment) bool) (*api.Released, *batch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := &api.Released{Released: []api.Allocation{}}
	o := s.overlays[req.Network]
	if o == nil {
		return out, nil
	}
	var b *batch
	for _, at := range sortedAttachments(o.Attached) {
		rec := o.Attached[at]
		if kept(at) || (req.Bridge != "" && rec.Bridge != req.Bridge) || s.commits.Pending(allocKey(o.Name, at)) {
			continue
		}
		out.Released = append(out.Released, *s.render(o, at, rec))
		b = s.release(o, at)
	}
	return out, b
}

// Lookup returns an attachment's addresses.
func (s *Service) Lookup(req api.IPAMRequest) (*api.Allocation, error) {
	if err := ipamvalidate.Request(&req); err != nil {
		return nil, failure(http.StatusBadRequest, api.CodeBadRequest, "%v", err)
	}
	at := ring.Attachment{ContainerID: req.ContainerID, Interface: req.IfName}
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.commits.WaitPending(allocKey(req.Network, at)) {
	}
	o := s.overlays[req.Network]
	if o == nil {
		// Not restored yet (not_ready), or an unknown network (not_found):
		// never "no addresses" for an attachment that may hold some.
		_, err := s.overlayFor(req.Network, false)
		return nil, err
	}
	if rec, ok := o.Attached[at]; ok {
		return s.render(o, at, rec), nil
	}
	if _, pending := s.persist[req.Network][at]; pending {
		return nil, failure(http.StatusServiceUnavailable, api.CodeNotReady, "%s/%s holds a persisted address that is not claimable yet", req.ContainerID, req.IfName)
	}
	return nil, failure(http.StatusNotFound, api.CodeNotFound, "no addresses for %s/%s on %q", req.ContainerID, req.IfName, req.Network)
}
