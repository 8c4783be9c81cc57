package dockeripam_test

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/carve-net/carve/api"
)

// fakeIPAM is a test double of *agent.IPAM with the same rules, for tests
// that run without root (the real one needs an agent, hence a namespace):
// lowest free address of the bridge's range, network, gateway and broadcast
// excluded; idempotent per (network, container id, ifname); claims; release
// by attachment or by address.
type fakeIPAM struct {
	mu       sync.Mutex
	overlays map[string]*fakeOverlay
	// failRelease makes Release and ReleaseAddress fail (errors in the collector).
	failRelease bool
}

type fakeOverlay struct {
	bridges  map[string][2]netip.Prefix
	attached map[[2]string]fakeRecord
}

type fakeRecord struct {
	bridge string
	v4, v6 netip.Addr
}

// newFakeIPAM serves no overlay until addOverlay gives it one with its
// bridges' ranges (v4, v6; an invalid prefix for an absent family).
func newFakeIPAM() *fakeIPAM { return &fakeIPAM{overlays: map[string]*fakeOverlay{}} }

func (f *fakeIPAM) addOverlay(name string, bridges map[string][2]netip.Prefix) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.overlays[name] = &fakeOverlay{bridges: bridges, attached: map[[2]string]fakeRecord{}}
}

func (f *fakeIPAM) used(o *fakeOverlay) map[netip.Addr]bool {
	m := map[netip.Addr]bool{}
	for _, r := range o.attached {
		m[r.v4], m[r.v6] = true, true
	}
	return m
}

func (f *fakeIPAM) Allocate(req api.IPAMRequest) (*api.Allocation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if req.Network == "" || req.ContainerID == "" || req.IfName == "" {
		return nil, errors.New("network, container_id and ifname are required")
	}
	if req.Bridge == "" {
		req.Bridge = api.BridgeMesos
	}
	o := f.overlays[req.Network]
	if o == nil {
		return nil, fmt.Errorf("not_ready: no lease for %q", req.Network)
	}
	at := [2]string{req.ContainerID, req.IfName}
	if r, ok := o.attached[at]; ok {
		if r.bridge != req.Bridge {
			return nil, fmt.Errorf("conflict: %s holds addresses on the %s bridge", at, r.bridge)
		}
		return f.render(req.Network, o, at, r), nil
	}
	subs, ok := o.bridges[req.Bridge]
	if !ok {
		return nil, fmt.Errorf("no %s bridge on %q", req.Bridge, req.Network)
	}
	var claim netip.Addr
	if req.Address != "" {
		var err error
		if claim, err = netip.ParseAddr(req.Address); err != nil {
			return nil, err
		}
	}
	used := f.used(o)
	rec := fakeRecord{bridge: req.Bridge}
	for i, sub := range subs {
		fam := []string{"4", "6"}[i]
		if !sub.IsValid() || (req.Family != "" && req.Family != fam) {
			continue
		}
		var got netip.Addr
		if claim.IsValid() && claim.Is4() == (i == 0) {
			switch {
			case !sub.Contains(claim):
				return nil, fmt.Errorf("conflict: address %s is outside the %s bridge's %s", claim, req.Bridge, sub)
			case used[claim] || claim == sub.Masked().Addr() || claim == sub.Masked().Addr().Next():
				return nil, fmt.Errorf("taken: address %s is held by another container", claim)
			}
			got = claim
		} else {
			last := lastAddr(sub)
			for a := sub.Masked().Addr().Next().Next(); sub.Contains(a) && a != last; a = a.Next() {
				if !used[a] {
					got = a
					break
				}
			}
			if !got.IsValid() {
				return nil, fmt.Errorf("exhausted: the %s bridge's %s has no free address", req.Bridge, sub)
			}
		}
		if i == 0 {
			rec.v4 = got
		} else {
			rec.v6 = got
		}
	}
	if !rec.v4.IsValid() && !rec.v6.IsValid() {
		return nil, fmt.Errorf("no address family to allocate from on %q (family %q)", req.Network, req.Family)
	}
	o.attached[at] = rec
	return f.render(req.Network, o, at, rec), nil
}

func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().AsSlice()
	bits := p.Bits()
	for i := range a {
		for b := 0; b < 8; b++ {
			if i*8+b >= bits {
				a[i] |= 0x80 >> b
			}
		}
	}
	out, _ := netip.AddrFromSlice(a)
	if p.Addr().Is4() {
		return out.Unmap()
	}
	return out
}

func (f *fakeIPAM) render(network string, o *fakeOverlay, at [2]string, r fakeRecord) *api.Allocation {
	out := &api.Allocation{Network: network, ContainerID: at[0], IfName: at[1], Bridge: r.bridge, MTU: 1420}
	subs := o.bridges[r.bridge]
	for i, a := range []netip.Addr{r.v4, r.v6} {
		if a.IsValid() {
			gw := subs[i].Masked().Addr().Next()
			out.IPs = append(out.IPs, api.IPConfig{Address: netip.PrefixFrom(a, subs[i].Bits()).String(), Gateway: gw.String()})
		}
	}
	return out
}

func (f *fakeIPAM) Release(req api.IPAMRequest) (*api.Released, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failRelease {
		return nil, errors.New("injected release failure")
	}
	out := &api.Released{Released: []api.Allocation{}}
	o := f.overlays[req.Network]
	if o == nil {
		return out, nil
	}
	at := [2]string{req.ContainerID, req.IfName}
	if r, ok := o.attached[at]; ok {
		out.Released = append(out.Released, *f.render(req.Network, o, at, r))
		delete(o.attached, at)
	}
	return out, nil
}

func (f *fakeIPAM) ReleaseAddress(network string, addr netip.Addr) (*api.Released, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failRelease {
		return nil, errors.New("injected release failure")
	}
	out := &api.Released{Released: []api.Allocation{}}
	o := f.overlays[network]
	if o == nil {
		return out, nil
	}
	for _, at := range sortedKeys(o.attached) {
		r := o.attached[at]
		if r.v4 == addr || r.v6 == addr {
			out.Released = append(out.Released, *f.render(network, o, at, r))
			delete(o.attached, at)
		}
	}
	return out, nil
}

func sortedKeys(m map[[2]string]fakeRecord) [][2]string {
	out := make([][2]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b [2]string) int { return strings.Compare(a[0]+"\x00"+a[1], b[0]+"\x00"+b[1]) })
	return out
}

func (f *fakeIPAM) List(network string) *api.Allocations {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &api.Allocations{Allocations: []api.Allocation{}}
	for _, name := range f.networksLocked() {
		if network != "" && name != network {
			continue
		}
		o := f.overlays[name]
		for _, at := range sortedKeys(o.attached) {
			out.Allocations = append(out.Allocations, *f.render(name, o, at, o.attached[at]))
		}
	}
	return out
}

func (f *fakeIPAM) networksLocked() []string {
	var out []string
	for n := range f.overlays {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func (f *fakeIPAM) Networks() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.networksLocked()
}

func (f *fakeIPAM) BridgeSubnets(network, bridge string) (v4, v6 netip.Prefix, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o := f.overlays[network]
	if o == nil {
		return netip.Prefix{}, netip.Prefix{}, false
	}
	p, ok := o.bridges[bridge]
	return p[0], p[1], ok
}
