package wireguard

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Keepalive is every peer's persistent keepalive. Its first keepalive,
// sent as the peer is put in, starts a session at once (after a peer's key
// changed, it is the one that succeeds, whichever side learnt the new key
// last); later ones keep sessions up between hosts with idle containers.
// It costs one 32-byte packet per peer every 25 s.
const Keepalive = 25 * time.Second

func ptr[T any](v T) *T { return &v }

// Peer is another agent reached through the device.
type Peer struct {
	// ID names the agent in errors and logs.
	ID string
	// PublicKey is the key of its master-signed record.
	PublicKey wgtypes.Key
	// Endpoint is its underlay IP and the network's WireGuard port.
	Endpoint netip.AddrPort
	// AllowedIPs are what it may send from and what is routed to it: its
	// VTEP addresses and its blocks of every overlay, from its signed
	// record (and the ring's grants to it).
	AllowedIPs []netip.Prefix
}

// Desired is the whole state of the device and its routes.
type Desired struct {
	PrivateKey wgtypes.Key
	Port       int
	// MTU of the interface; 0 leaves it.
	MTU int
	// Source and Source6 are the source addresses of this host's own
	// packets routed through the device (its VTEP addresses, which peers
	// allow from it); invalid: the kernel's choice.
	Source, Source6 netip.Addr
	Peers           []Peer
	// Unreachable are prefixes whose packets must never leave in the
	// clear (the overlays' subnets): an unreachable route catches what no
	// longer route (a peer's, a local bridge's) takes.
	Unreachable []netip.Prefix
}

// Report tells what an Apply changed and what it refused.
type Report struct {
	PeersAdded, PeersUpdated, PeersRemoved int
	RoutesSet, RoutesRemoved               int
	// Rejected names the peers left out: a duplicate public key, or this
	// device's own.
	Rejected []string
	Duration time.Duration
}

// Changes is the number of changes made.
func (r *Report) Changes() int {
	return r.PeersAdded + r.PeersUpdated + r.PeersRemoved + r.RoutesSet + r.RoutesRemoved
}

// Apply brings the device, its peers and its routes to want. Peers that
// did not change are not touched, so their sessions survive.
func (d *Device) Apply(ctx context.Context, want *Desired) (Report, error) {
	start := time.Now()
	var rep Report
	d.mu.Lock()
	defer d.mu.Unlock()
	cur, err := d.client.Device(d.name)
	if err != nil {
		return rep, fmt.Errorf("wireguard: read %s: %w", d.name, err)
	}
	cfg, changed := planDevice(cur, want, &rep)
	d.own = want.PrivateKey.PublicKey()
	if changed {
		if err := d.configure(cfg); err != nil {
			return rep, err
		}
	}
	link, err := d.nl.LinkByName(d.name)
	if err != nil {
		return rep, fmt.Errorf("wireguard: %s: %w", d.name, err)
	}
	if want.MTU > 0 && link.Attrs().MTU != want.MTU {
		if err := d.nl.LinkSetMTU(link, want.MTU); err != nil {
			return rep, fmt.Errorf("wireguard: set %s mtu %d: %w", d.name, want.MTU, err)
		}
	}
	if link.Attrs().OperState == 0 || link.Attrs().Flags&net.FlagUp == 0 {
		if err := d.nl.LinkSetUp(link); err != nil {
			return rep, fmt.Errorf("wireguard: set %s up: %w", d.name, err)
		}
	}
	err = applyRoutes(ctx, d.nl, link.Attrs().Index, want, &rep)
	rep.Duration = time.Since(start)
	return rep, err
}

// configure sends cfg to the device and notes the peers it puts in for
// the handshake check. The time noted is taken before the call: a peer's
// first handshake (its keepalive starts one as it is put in) often
// completes before the call returns, and taken after, it would look like
// none and the check would tear down the fresh session. d.mu is held.
func (d *Device) configure(cfg wgtypes.Config) error {
	at := time.Now()
	if err := d.client.ConfigureDevice(d.name, cfg); err != nil {
		return fmt.Errorf("wireguard: configure %s: %w", d.name, err)
	}
	d.notePutIn(&cfg, at)
	return nil
}

// planDevice is the configuration that takes the device from cur to want
// (false when it is there already). A peer whose key, endpoint and
// allowed IPs are unchanged is left out, so its session stays.
func planDevice(cur *wgtypes.Device, want *Desired, rep *Report) (wgtypes.Config, bool) {
	var cfg wgtypes.Config
	changed := false
	if cur.PrivateKey != want.PrivateKey {
		// A new key ends every session: the peers are put in again, each
		// with an immediate keepalive, so that sessions under the new key
		// start now and not at the next packet or retry (5 s).
		cfg.PrivateKey = &want.PrivateKey
		cfg.ReplacePeers = true
		changed = true
	}
	if cur.ListenPort != want.Port {
		cfg.ListenPort = &want.Port
		changed = true
	}
	have := map[wgtypes.Key]wgtypes.Peer{}
	for _, p := range cur.Peers {
		have[p.PublicKey] = p
	}
	own := want.PrivateKey.PublicKey()
	seen := map[wgtypes.Key]bool{}
	for _, p := range want.Peers {
		if p.PublicKey == own || seen[p.PublicKey] {
			rep.Rejected = append(rep.Rejected, p.ID)
			continue
		}
		seen[p.PublicKey] = true
		old, ok := have[p.PublicKey]
		if ok && samePeer(old, p) && !cfg.ReplacePeers {
			continue
		}
		if ok {
			rep.PeersUpdated++
		} else {
			rep.PeersAdded++
		}
		cfg.Peers = append(cfg.Peers, wgtypes.PeerConfig{
			PublicKey: p.PublicKey, Endpoint: net.UDPAddrFromAddrPort(p.Endpoint),
			ReplaceAllowedIPs: true, AllowedIPs: ipNets(p.AllowedIPs),
			PersistentKeepaliveInterval: ptr(Keepalive),
		})
		changed = true
	}
	for k := range have {
		if !seen[k] && !cfg.ReplacePeers {
			cfg.Peers = append(cfg.Peers, wgtypes.PeerConfig{PublicKey: k, Remove: true})
			rep.PeersRemoved++
			changed = true
		}
	}
	return cfg, changed
}

// samePeer tells whether the device's peer already has want's endpoint and
// allowed IPs.
func samePeer(have wgtypes.Peer, want Peer) bool {
	if have.Endpoint == nil || have.PersistentKeepaliveInterval != Keepalive {
		return false
	}
	ep := have.Endpoint.AddrPort()
	if netip.AddrPortFrom(ep.Addr().Unmap(), ep.Port()) != want.Endpoint {
		return false
	}
	var got []netip.Prefix
	for _, n := range have.AllowedIPs {
		p, ok := prefixOf(n)
		if !ok {
			return false
		}
		got = append(got, p)
	}
	return slices.Equal(sortedPrefixes(got), sortedPrefixes(want.AllowedIPs))
}

func ipNets(ps []netip.Prefix) []net.IPNet {
	out := make([]net.IPNet, 0, len(ps))
	for _, p := range ps {
		p = p.Masked()
		out = append(out, net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())})
	}
	return out
}

func prefixOf(n net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, bits := n.Mask.Size()
	a = a.Unmap()
	if bits != a.BitLen() {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(a, ones).Masked(), true
}

func sortedPrefixes(ps []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.Masked())
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return slices.Compact(out)
}
