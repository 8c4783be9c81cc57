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
		case o.disabled:
			return nil, failure(http.StatusConflict, api.CodeConflict, "%s", o.unserved)
		case o.unserved != "":
			return nil, failure(http.StatusServiceUnavailable, api.CodeNotReady, "%s", o.unserved)
		case errors.Is(o.seedErr, errRingUnread):
			return nil, failure(http.StatusServiceUnavailable, api.CodeNotReady, "%v", o.seedErr)
		case o.seedErr != nil:
			return nil, failure(http.StatusServiceUnavailable, api.CodeNotReady, "overlay %q: the address ring refused the masters' leases: %v", name, o.seedErr)
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
	out := &api.Allocation{Network: o.name, ContainerID: at.ContainerID, IfName: at.Interface, Bridge: rec.Bridge, MTU: s.mtu, Owner: rec.Owner}
	for fam := range families {
		addr := rec.addr(fam)
		if !addr.IsValid() {
			continue
		}
		sub := o.blockOf(rec.Bridge, addr)
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
		for _, at := range sortedAttachments(o.attached) {
			out.Allocations = append(out.Allocations, *s.render(o, at, o.attached[at]))
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
	if o == nil || o.unserved != "" {
		return netip.Prefix{}, netip.Prefix{}, false
	}
	p, ok := o.bridges[bridge]
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
	for kind, subs := range o.bridges {
		if subs[0].IsValid() {
			st.Free[kind] = o.freeHosts(kind, 0)
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
		for _, b := range o.blocks[fam] {
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
			a := o.alloc[fam]
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
