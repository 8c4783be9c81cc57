package wireguard

import (
	"net"
	"net/netip"
	"slices"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

func mustKey(t *testing.T) wgtypes.Key {
	t.Helper()
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// devicePeer is p as the device reports it once configured.
func devicePeer(p Peer) wgtypes.Peer {
	return wgtypes.Peer{PublicKey: p.PublicKey, Endpoint: net.UDPAddrFromAddrPort(p.Endpoint),
		AllowedIPs: ipNets(p.AllowedIPs), PersistentKeepaliveInterval: Keepalive}
}

func TestPlanDevice(t *testing.T) {
	own, other := mustKey(t), mustKey(t)
	a := Peer{ID: "a", PublicKey: mustKey(t).PublicKey(), Endpoint: netip.MustParseAddrPort("198.18.0.12:51820"),
		AllowedIPs: prefixes("100.64.0.2/32", "10.128.1.0/24")}
	b := Peer{ID: "b", PublicKey: mustKey(t).PublicKey(), Endpoint: netip.MustParseAddrPort("198.18.0.13:51820"),
		AllowedIPs: prefixes("100.64.0.3/32", "10.128.2.0/24", "fd00:2::/64")}
	gone := mustKey(t).PublicKey()
	moved := a
	moved.Endpoint = netip.MustParseAddrPort("198.18.0.99:51820")
	grown := b
	grown.AllowedIPs = append(slices.Clone(b.AllowedIPs), netip.MustParsePrefix("10.128.200.0/25"))
	dupKey := b
	dupKey.ID = "b-again"
	self := a
	self.ID, self.PublicKey = "self", own.PublicKey()

	configured := &wgtypes.Device{PrivateKey: own, ListenPort: 51820, Peers: []wgtypes.Peer{devicePeer(a), devicePeer(b)}}
	tests := []struct {
		name         string
		cur          *wgtypes.Device
		want         Desired
		changed      bool
		replace      bool
		configured   []string // peers' ids in the configuration, in order
		removed      int
		rejected     []string
		addedUpdated [2]int
	}{
		{"fresh device", &wgtypes.Device{}, Desired{PrivateKey: own, Port: 51820, Peers: []Peer{a, b}},
			true, true, []string{"a", "b"}, 0, nil, [2]int{2, 0}},
		{"nothing to do", configured, Desired{PrivateKey: own, Port: 51820, Peers: []Peer{a, b}},
			false, false, nil, 0, nil, [2]int{0, 0}},
		{"allowed IPs in another order", configured, Desired{PrivateKey: own, Port: 51820,
			Peers: []Peer{a, {ID: "b", PublicKey: b.PublicKey, Endpoint: b.Endpoint, AllowedIPs: prefixes("fd00:2::/64", "10.128.2.0/24", "100.64.0.3/32")}}},
			false, false, nil, 0, nil, [2]int{0, 0}},
		{"a peer moved, one grew, one left", &wgtypes.Device{PrivateKey: own, ListenPort: 51820,
			Peers: []wgtypes.Peer{devicePeer(a), devicePeer(b), {PublicKey: gone}}},
			Desired{PrivateKey: own, Port: 51820, Peers: []Peer{moved, grown}},
			true, false, []string{"a", "b"}, 1, nil, [2]int{0, 2}},
		{"new key: every peer again", configured, Desired{PrivateKey: other, Port: 51820, Peers: []Peer{a, b}},
			true, true, []string{"a", "b"}, 0, nil, [2]int{0, 2}},
		{"duplicate and own keys rejected", configured, Desired{PrivateKey: own, Port: 51820, Peers: []Peer{self, a, b, dupKey}},
			false, false, nil, 0, []string{"self", "b-again"}, [2]int{0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var rep Report
			cfg, changed := planDevice(tt.cur, &tt.want, &rep)
			if changed != tt.changed || cfg.ReplacePeers != tt.replace {
				t.Fatalf("changed %v replace %v, want %v %v", changed, cfg.ReplacePeers, tt.changed, tt.replace)
			}
			var ids []string
			removed := 0
			for _, pc := range cfg.Peers {
				if pc.Remove {
					removed++
					continue
				}
				i := slices.IndexFunc(tt.want.Peers, func(p Peer) bool { return p.PublicKey == pc.PublicKey })
				ids = append(ids, tt.want.Peers[i].ID)
				if !pc.ReplaceAllowedIPs || pc.PersistentKeepaliveInterval == nil || *pc.PersistentKeepaliveInterval != Keepalive {
					t.Errorf("peer %s: %+v, want its allowed IPs replaced and a keepalive", tt.want.Peers[i].ID, pc)
				}
			}
			if !slices.Equal(ids, tt.configured) || removed != tt.removed || !slices.Equal(rep.Rejected, tt.rejected) ||
				rep.PeersAdded != tt.addedUpdated[0] || rep.PeersUpdated != tt.addedUpdated[1] {
				t.Errorf("configured %v removed %d rejected %v added %d updated %d; want %v %d %v %v",
					ids, removed, rep.Rejected, rep.PeersAdded, rep.PeersUpdated, tt.configured, tt.removed, tt.rejected, tt.addedUpdated)
			}
		})
	}
}

func TestDesiredRoutes(t *testing.T) {
	want := &Desired{
		Source: netip.MustParseAddr("100.64.0.1"), Source6: netip.MustParseAddr("fd01::1"),
		Peers: []Peer{
			{ID: "a", AllowedIPs: prefixes("100.64.0.2/32", "10.128.1.0/24", "fd00:1::/64")},
			{ID: "evil", AllowedIPs: prefixes("10.128.9.0/24")},
		},
		Unreachable: prefixes("10.128.0.0/9", "fd00::/48"),
	}
	got := desiredRoutes(want, []string{"evil"})
	expect := map[netip.Prefix]routeWant{
		netip.MustParsePrefix("100.64.0.2/32"): {dst: netip.MustParsePrefix("100.64.0.2/32"), src: want.Source},
		netip.MustParsePrefix("10.128.1.0/24"): {dst: netip.MustParsePrefix("10.128.1.0/24"), src: want.Source},
		netip.MustParsePrefix("fd00:1::/64"):   {dst: netip.MustParsePrefix("fd00:1::/64"), src: want.Source6},
		netip.MustParsePrefix("10.128.0.0/9"):  {dst: netip.MustParsePrefix("10.128.0.0/9"), unreachable: true},
		netip.MustParsePrefix("fd00::/48"):     {dst: netip.MustParsePrefix("fd00::/48"), unreachable: true},
	}
	if len(got) != len(expect) {
		t.Fatalf("routes %v, want %v", got, expect)
	}
	for p, w := range expect {
		if got[p] != w {
			t.Errorf("%s: %+v, want %+v", p, got[p], w)
		}
	}
}
