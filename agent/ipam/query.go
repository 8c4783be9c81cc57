package ipam

import (
	"errors"
	"net/http"
	"net/netip"

	"github.com/carve-net/carve/agent/ipam/blockaddr"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/ring"
)

// overlayFor returns the overlay, or an error saying why there is none. For
// an allocation the overlay must also be served; a lookup or a release
// works on an overlay that stopped being served, so runtimes can clean up.
// The caller holds s.mu.
func (s *Service) overlayFor(name string, allocating bool) (*overlay, error) {
	if o := s.overlays[name]; o != nil {
		switch {
		case !allocating:
		case o.Disabled:
			return nil, failure(http.StatusConflict, api.CodeConflict, "%s", o.Unserved)
		case o.Unserved != "":
			return nil, failure(http.StatusServiceUnavailable, api.CodeNotReady, "%s", o.Unserved)
		case errors.Is(o.SeedErr, errRingUnread):
			return nil, failure(http.StatusServiceUnavailable, api.CodeNotReady, "%v", o.SeedErr)
		case o.SeedErr != nil:
			return nil, failure(http.StatusServiceUnavailable, api.CodeNotReady, "overlay %q: the address ring refused the masters' leases: %v", name, o.SeedErr)
		}
		return o, nil
	}
	if !s.synced {
		return nil, failure(http.StatusServiceUnavailable, api.CodeNotReady, "the agent is starting up: its allocations are being restored")
	}
	self := s.view.Self
	if self == nil {
		return nil, failure(http.StatusServiceUnavailable, api.CodeNotReady, "this agent has no lease yet (not registered with a master)")
	}
	if ov := self.Overlay(name); ov != nil {
		return nil, failure(http.StatusServiceUnavailable, api.CodeNotReady, "%s", statusMessage(ov))
	}
	return nil, failure(http.StatusNotFound, api.CodeNotFound, "unknown network %q (this agent has no such overlay)", name)
}

// render is an attachment's addresses with gateways and routes. The caller
// holds s.mu.
func (s *Service) render(o *overlay, at ring.Attachment, rec allocRecord) *api.Allocation {
	out := &api.Allocation{Network: o.Name, ContainerID: at.ContainerID, IfName: at.Interface, Bridge: rec.Bridge, MTU: s.mtu, Owner: rec.Owner}
	for fam := range families {
		addr := rec.Addr(fam)
		if !addr.IsValid() {
			continue
		}
		sub := o.BlockOf(rec.Bridge, addr)
		gw := blockaddr.Gateway(sub)
		out.IPs = append(out.IPs, api.IPConfig{Address: netip.PrefixFrom(addr, sub.Bits()).String(), Gateway: gw.String()})
		dst := "0.0.0.0/0"
		if fam == 1 {
			dst = "::/0"
		}
		out.Routes = append(out.Routes, api.Route{Dst: dst, GW: gw.String()})
	}
	return out
}

// List returns the allocations of a network (every network when empty),
// including those of overlays no longer served, and changes still in flight.
func (s *Service) List(network string) *api.Allocations {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := &api.Allocations{Allocations: []api.Allocation{}}
	for _, name := range sortedKeys(s.overlays) {
		if network != "" && name != network {
			continue
		}
		o := s.overlays[name]
		for _, at := range sortedAttachments(o.Attached) {
			out.Allocations = append(out.Allocations, *s.render(o, at, o.Attached[at]))
		}
	}
	return out
}

// BridgeSubnets returns a bridge's IPv4 and IPv6 sub-subnets on a served
// overlay (an invalid prefix where the family is absent), and false when
// this agent has no such bridge or does not serve the overlay.
func (s *Service) BridgeSubnets(network, bridge string) (v4, v6 netip.Prefix, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.overlays[network]
	if o == nil || o.Unserved != "" {
		return netip.Prefix{}, netip.Prefix{}, false
	}
	p, ok := o.Bridges[bridge]
	return p[0], p[1], ok
}

// Status tells whether allocations on the network can work now.
func (s *Service) Status(network string) *api.IPAMStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := &api.IPAMStatus{Network: network}
	o, err := s.overlayFor(network, true)
	if err != nil {
		st.Error = err.Error()
		var ae *api.Error
		if errors.As(err, &ae) {
			st.Error = ae.Message
		}
		return st
	}
	st.Ready = true
	st.Free = map[string]uint64{}
	st.Blocks, st.Blocks6 = map[string][]api.IPAMBlockUsage{}, map[string][]api.IPAMBlockUsage{}
	for kind, subs := range o.Bridges {
		if subs[0].IsValid() {
			st.Free[kind] = o.FreeHosts(kind, 0)
			st.Blocks[kind] = s.blockUsage(o, kind, 0)
		}
		if subs[1].IsValid() {
			st.Blocks6[kind] = s.blockUsage(o, kind, 1)
		}
	}
	return st
}

// BridgeGateways returns the gateway addresses (with their block's prefix
// length) a bridge needs beyond its first sub-subnet's: one per grown block.
func (s *Service) BridgeGateways(network, bridge string) []netip.Prefix {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.overlays[network]
	if o == nil {
		return nil
	}
	var out []netip.Prefix
	for fam := range families {
		for _, b := range o.Blocks[fam] {
			if b.Bridge == bridge {
				out = append(out, netip.PrefixFrom(blockaddr.Gateway(b.Prefix), b.Prefix.Bits()))
			}
		}
	}
	return out
}

// PeerBlocks returns, for every other agent, the blocks the rings give it
// beyond the subnets the masters route to it (known): grants made through
// the ring that the masters' records do not show yet. Each is routed to
// the agent; it is a longer prefix than its donor's route.
func (s *Service) PeerBlocks(known map[string][]netip.Prefix) map[string][]netip.Prefix {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string][]netip.Prefix{}
	for _, name := range sortedKeys(s.overlays) {
		o := s.overlays[name]
		for fam := range families {
			a := o.Alloc[fam]
			if a == nil {
				continue
			}
			r := a.Ring()
			for _, peer := range r.Peers() {
				if peer == s.id {
					continue
				}
				for _, p := range r.Blocks(peer) {
					out[peer] = append(out[peer], blockaddr.Uncovered(p, known[peer])...)
				}
			}
		}
	}
	for peer, ps := range out {
		if len(ps) == 0 {
			delete(out, peer)
		}
	}
	return out
}

// blockUsage is one block of a bridge as the status shows it.
func (s *Service) blockUsage(o *overlay, bridge string, fam int) []api.IPAMBlockUsage {
	var out []api.IPAMBlockUsage
	for i, p := range o.BridgeBlocks(bridge, fam) {
		u := api.IPAMBlockUsage{Prefix: p.String(), Origin: "lease"}
		if i > 0 || p != o.Bridges[bridge][fam] {
			if b := o.Held(fam, p); b != nil {
				u.Origin, u.Donor = b.Origin, b.Donor
			}
		}
		for _, rec := range o.Attached {
			if rec.Bridge == bridge && p.Contains(rec.Addr(fam)) {
				u.Used++
			}
		}
		if a := o.Alloc[fam]; a != nil {
			u.Free, _ = a.FreeHosts(p).Uint64()
		}
		out = append(out, u)
	}
	return out
}
