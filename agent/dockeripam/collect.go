package dockeripam

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/carve-net/carve/api"
)

// collect releases the docker-bridge allocations that no container of the
// engine uses and that have been unused for GCGrace. It releases nothing
// when the engine cannot be listed completely.
func (s *Service) collect(ctx context.Context, c *engineClient) error {
	used, eps, err := s.usedAddresses(ctx, c)
	now := s.opts.Now()
	if err != nil {
		s.mu.Lock()
		s.status.GC.LastRun, s.status.GC.Error = now, err.Error()
		s.status.Containers, s.status.ContainersListed = nil, time.Time{}
		s.mu.Unlock()
		s.note("gc", slog.LevelWarn, "docker leak collection skipped: the engine's endpoints could not be listed", "err", err)
		return err
	}
	// Addresses running containers hold that the agent does not know (it
	// lost its data dir) are claimed back first; only then may new
	// addresses be handed out.
	s.driver.reclaim(eps)
	released, err := s.driver.collect(used, now, s.opts.GCGrace)
	seen := make([]ContainerAddress, 0, len(eps))
	for _, ep := range eps {
		seen = append(seen, ContainerAddress{Overlay: ep.overlay, Address: ep.addr.String(), ContainerID: ep.containerID, Name: ep.name, EndpointID: ep.endpointID})
	}
	s.mu.Lock()
	s.status.Containers, s.status.ContainersListed = seen, now
	s.status.GC.LastRun = now
	s.status.GC.Released += released
	s.status.GC.Error = ""
	if err != nil {
		s.status.GC.Error = err.Error()
	}
	s.mu.Unlock()
	if err != nil {
		s.note("gc", slog.LevelWarn, "docker leak collection", "err", err)
	} else {
		s.note("gc", slog.LevelDebug, "docker leak collection ok")
	}
	return err
}

// dockerEndpoint is an address an endpoint holds on one of the plugin's networks.
type dockerEndpoint struct {
	overlay    string
	endpointID string
	// containerID and name are the engine's container (name may be empty).
	containerID string
	name        string
	addr        netip.Addr
}

// usedAddresses lists the addresses of every endpoint on the networks whose
// IPAM driver is this plugin, and those endpoints with their overlay.
func (s *Service) usedAddresses(ctx context.Context, c *engineClient) (map[string]bool, []dockerEndpoint, error) {
	cctx, cancel := context.WithTimeout(ctx, engineCallTimeout)
	defer cancel()
	nets, err := c.listNetworks(cctx)
	if err != nil {
		return nil, nil, fmt.Errorf("list Docker networks: %w", err)
	}
	used := map[string]bool{}
	var eps []dockerEndpoint
	for _, n := range nets {
		if n.IPAM.Driver != s.name {
			continue
		}
		full, err := c.inspectNetwork(cctx, n.ID)
		if err != nil {
			return nil, nil, fmt.Errorf("inspect Docker network %s: %w", n.Name, err)
		}
		// The overlay, whatever the network's name (legacy or templated).
		overlay := full.IPAM.Options[OptionNetwork]
		if overlay == "" {
			overlay = full.Labels[LabelOverlay]
		}
		for id, ep := range full.Containers {
			for _, a := range []string{ep.IPv4Address, ep.IPv6Address} {
				if addr, err := parseAddr(a); err == nil {
					used[addr.String()] = true
					if overlay == "" {
						continue // no overlay to take the address back on
					}
					epID := ep.EndpointID
					if epID == "" {
						epID = id
					}
					eps = append(eps, dockerEndpoint{overlay: overlay, endpointID: epID, containerID: id, name: ep.Name, addr: addr})
				}
			}
		}
	}
	return used, eps, nil
}

// collect is the decision, under the driver's lock so that no request for
// the same attachment interleaves: an allocation is released when none of
// its addresses is in used and it was already seen unused grace ago.
func (d *driver) collect(used map[string]bool, now time.Time, grace time.Duration) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	seen := map[string]bool{}
	released := 0
	var errs []error
	for _, ov := range d.svc.Networks() {
		for _, a := range d.svc.List(ov).Allocations {
			if a.Bridge != api.BridgeDocker {
				continue
			}
			key := attachmentKey(ov, a.ContainerID, a.IfName)
			inUse := false
			for _, ip := range a.IPs {
				if addr, err := parseAddr(ip.Address); err == nil && used[addr.String()] {
					inUse = true
				}
			}
			if inUse {
				continue
			}
			seen[key] = true
			since, ok := d.unusedSince[key]
			if !ok {
				d.unusedSince[key] = now
				continue
			}
			if now.Sub(since) < grace {
				continue
			}
			if _, err := d.svc.Release(api.IPAMRequest{Network: ov, ContainerID: a.ContainerID, IfName: a.IfName, Bridge: api.BridgeDocker}); err != nil {
				errs = append(errs, fmt.Errorf("release %s/%s on %s: %w", a.ContainerID, a.IfName, ov, err))
				continue
			}
			delete(d.unusedSince, key)
			released++
			d.log.Info("released an address no container uses", "overlay", ov, "attachment", a.ContainerID, "ifname", a.IfName, "addresses", a.IPs, "unused_since", since)
		}
	}
	for k := range d.unusedSince {
		if !seen[k] {
			delete(d.unusedSince, k)
		}
	}
	return released, errors.Join(errs...)
}
