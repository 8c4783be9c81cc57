package dockeripam

import (
	"maps"
	"net/netip"
	"time"

	"github.com/carve-net/carve/api"
)

// The take-back: an agent that restarts (or lost its data dir) must not
// hand a new container an address a running container holds. So
// RequestAddress waits until the engine's running containers were listed
// (Docker's own view of its endpoints) and every address they hold is held
// by an allocation of the agent: restored from its store, or claimed back
// here. An overlay the agent has not restored yet (its IPAM answers
// not_ready) keeps requests on it waiting, and the engine loop tries again
// every TakeBackRetry rather than at the next collection.

// DefaultTakeBackWait bounds how long a RequestAddress waits for the
// take-back before answering a retryable error (Docker gives a plugin call
// 30 s).
const DefaultTakeBackWait = 10 * time.Second

// DefaultTakeBackRetry is how soon the engine loop lists the engine again
// while a take-back waits for the agent to restore an overlay.
const DefaultTakeBackRetry = time.Second

// ownerRecorder is the optional part of an AddressService that records who
// holds an attachment (*ipam.Service implements it): Docker's request names
// no container, so the owner is learnt from the engine afterwards.
type ownerRecorder interface {
	SetOwner(network, containerID, ifName string, owner *api.Owner) error
}

// signal wakes the requests waiting for the take-back. The caller holds d.mu.
func (d *driver) signal() {
	close(d.changed)
	d.changed = make(chan struct{})
}

// markReady opens the driver without a take-back: no engine answers, so no
// running container holds an address of this host's Docker.
func (d *driver) markReady() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.waiting = nil
	d.ready.Store(true)
	d.signal()
}

// takeBackPending says why a request on overlay must wait ("" when it need not).
// The caller holds d.mu.
func (d *driver) takeBackPending(overlay string) string {
	if d.gated.Load() && !d.ready.Load() {
		return "the engine's running containers have not been listed yet"
	}
	return d.waiting[overlay]
}

// takeBackWaiting tells whether the last take-back left an overlay waiting.
func (d *driver) takeBackWaiting() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.waiting) > 0 || (d.gated.Load() && !d.ready.Load())
}

// takeBackWaitingFor is, per overlay, why the take-back waits (nil: it does not).
func (d *driver) takeBackWaitingFor() map[string]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.waiting) == 0 {
		return nil
	}
	return maps.Clone(d.waiting)
}

// awaitTakeBack waits, at most takeBackWait, until the addresses running
// containers hold on overlay are the agent's; then it answers a retryable
// error saying what it waits for.
func (d *driver) awaitTakeBack(overlay string) error {
	var deadline <-chan time.Time
	for {
		d.mu.Lock()
		why, changed := d.takeBackPending(overlay), d.changed
		d.mu.Unlock()
		if why == "" {
			return nil
		}
		if deadline == nil {
			t := time.NewTimer(d.takeBackWait)
			defer t.Stop()
			deadline = t.C
		}
		select {
		case <-changed:
		case <-deadline:
			return errorf("carve is still taking back the addresses of running containers on overlay %q (%s), so that none is handed out twice; retry in a moment", overlay, why)
		}
	}
}

// networkServing is the Docker network that serves overlay's docker range:
// the one the engine loop found, else the one it makes.
func (d *driver) networkServing(overlay string) string {
	if d.servedBy != nil {
		if name := d.servedBy(overlay); name != "" {
			return name
		}
	}
	return NetworkName(d.networkTemplate, overlay)
}

// reclaim claims, for the endpoints' addresses that no allocation holds, an
// attachment named after the endpoint (Docker releases by address, so the
// name only has to be unique), records the endpoints' containers as the
// owners of the allocations that hold their addresses, and opens the driver
// for new requests on every overlay whose addresses are all held.
func (d *driver) reclaim(eps []dockerEndpoint) {
	d.mu.Lock()
	defer d.mu.Unlock()
	held := map[string]map[netip.Addr]api.Allocation{}
	waiting := map[string]string{}
	claimed, named := 0, 0
	for _, ep := range eps {
		if waiting[ep.overlay] != "" {
			continue
		}
		if held[ep.overlay] == nil {
			held[ep.overlay] = map[netip.Addr]api.Allocation{}
			for _, a := range d.svc.List(ep.overlay).Allocations {
				for _, ip := range a.IPs {
					if addr, err := parseAddr(ip.Address); err == nil {
						held[ep.overlay][addr] = a
					}
				}
			}
		}
		if a, ok := held[ep.overlay][ep.addr]; ok {
			if d.recordOwner(a, ep) {
				named++
			}
			continue
		}
		id := ep.endpointID
		if len(id) > 16 {
			id = id[:16]
		}
		req := api.IPAMRequest{Network: ep.overlay, ContainerID: attachmentPrefix + "ep-" + id, IfName: "eth0",
			Bridge: api.BridgeDocker, Address: ep.addr.String(), Family: "4", Owner: ep.owner("")}
		if ep.addr.Is6() {
			req.IfName, req.Family = "eth0-v6", "6"
		}
		alloc, err := d.svc.Allocate(req)
		if err != nil {
			if api.IsCode(err, api.CodeNotReady) {
				// Not restored yet: neither its records nor the ring are
				// there to tell what is free. Requests on it wait.
				waiting[ep.overlay] = err.Error()
				continue
			}
			d.log.Error("could not take back the address of a running container", "overlay", ep.overlay, "endpoint", ep.endpointID,
				"container", ep.containerID, "name", ep.name, "address", ep.addr, "err", err)
			continue
		}
		held[ep.overlay][ep.addr] = *alloc
		claimed++
	}
	if claimed > 0 {
		d.log.Warn("took back the addresses of running Docker containers", "count", claimed)
	}
	if named > 0 {
		d.log.Debug("recorded the Docker containers that hold addresses", "count", named)
	}
	for ov, why := range waiting {
		if d.waiting[ov] != why {
			d.log.Info("requests for addresses wait until the agent restored the overlay: running containers hold addresses on it", "overlay", ov, "reason", why)
		}
	}
	d.waiting = waiting
	d.ready.Store(true)
	d.signal()
}

// owner is the endpoint's container as the engine names it, keeping the
// MAC address the request gave.
func (ep dockerEndpoint) owner(mac string) *api.Owner {
	return &api.Owner{Runtime: api.RuntimeDocker, ContainerID: ep.containerID, ContainerName: ep.name, EndpointID: ep.endpointID, MAC: mac}
}

// recordOwner names the endpoint's container as the owner of a docker
// allocation that does not name it yet; it tells whether it did. The
// caller holds d.mu.
func (d *driver) recordOwner(a api.Allocation, ep dockerEndpoint) bool {
	rec, ok := d.svc.(ownerRecorder)
	if !ok || a.Bridge != api.BridgeDocker || ep.containerID == "" {
		return false
	}
	mac := ""
	if a.Owner != nil {
		if a.Owner.ContainerID == ep.containerID && a.Owner.ContainerName == ep.name && a.Owner.EndpointID == ep.endpointID {
			return false
		}
		mac = a.Owner.MAC
	}
	if err := rec.SetOwner(a.Network, a.ContainerID, a.IfName, ep.owner(mac)); err != nil {
		d.log.Warn("could not record the Docker container that holds an address", "overlay", a.Network, "attachment", a.ContainerID,
			"container", ep.containerID, "name", ep.name, "err", err)
		return false
	}
	return true
}
