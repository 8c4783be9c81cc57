package encryption

import (
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/carve-net/carve/agent/membership"
	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/vxlan"
	"github.com/carve-net/carve/wireguard"
)

func newTestWireGuard(t *testing.T, cfg Config) *WireGuard {
	t.Helper()
	w, err := New(t.TempDir(), cfg, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// encryptionWant is a desired dataplane with peers "keyed" (a key in its
// record) and "keyless" (none).
func encryptionWant(t *testing.T) (vxlan.Desired, membership.State, wgtypes.Key) {
	t.Helper()
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	peer := func(id string, n byte) vxlan.Peer {
		return vxlan.Peer{ID: id, UnderlayIP: netip.AddrFrom4([4]byte{198, 18, 0, 10 + n}), VTEPIP: netip.AddrFrom4([4]byte{100, 64, 0, n}),
			VTEPMAC: net.HardwareAddr{0x70, 0xb3, 0xd5, 0x40, 0, n}, Subnets: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 128, n, 0}), 24)}}
	}
	want := vxlan.Desired{VTEP: vxlan.VTEP{Address: netip.MustParsePrefix("100.64.0.1/16")}, Peers: []vxlan.Peer{peer("keyed", 2), peer("keyless", 3)}}
	members := membership.State{Records: []membership.PeerRecord{
		{ID: "keyed", Keys: api.AgentKeys{WireGuard: k.PublicKey().String()}},
		{ID: "keyless"},
	}}
	return want, members, k
}

func TestPlanEncryption(t *testing.T) {
	network := func(mode string) *api.NetworkConfig {
		return &api.NetworkConfig{Encryption: mode, OverlayMTU: 1420, Overlays: []api.OverlayNetwork{{Name: "carve", Subnet: "10.128.0.0/9", Prefix: 24}}}
	}
	tests := []struct {
		name      string
		mode      string
		unkeyed   bool // this agent's record carries no key
		vxlan     []string
		wireGuard []string
		byState   map[string]int
	}{
		{"off", "", false, []string{"keyed", "keyless"}, nil, map[string]int{}},
		{"wireguard", api.EncryptionWireGuard, false, []string{"keyless"}, []string{"keyed"}, map[string]int{api.PeerKeyed: 1, api.PeerCleartext: 1}},
		{"strict", api.EncryptionWireGuardStrict, false, nil, []string{"keyed"}, map[string]int{api.PeerKeyed: 1, api.PeerDropped: 1}},
		{"own key not registered", api.EncryptionWireGuard, true, []string{"keyed", "keyless"}, nil, map[string]int{api.PeerCleartext: 2}},
		{"own key not registered, strict", api.EncryptionWireGuardStrict, true, nil, nil, map[string]int{api.PeerDropped: 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newTestWireGuard(t, Config{})
			want, members, peerKey := encryptionWant(t)
			self := &api.AgentInfo{AgentID: "self", Keys: api.AgentKeys{WireGuard: w.RegisterKey()}}
			if tt.unkeyed {
				self.Keys.WireGuard = ""
			}
			p := w.Plan(self, network(tt.mode), members, &want)
			var vx, wg []string
			for _, peer := range want.Peers {
				vx = append(vx, peer.ID)
			}
			for _, peer := range p.desired.Peers {
				wg = append(wg, peer.ID)
				if peer.PublicKey != peerKey.PublicKey() || peer.Endpoint != netip.MustParseAddrPort("198.18.0.12:51820") ||
					!slices.Equal(peer.AllowedIPs, []netip.Prefix{netip.MustParsePrefix("100.64.0.2/32"), netip.MustParsePrefix("10.128.2.0/24")}) {
					t.Errorf("wireguard peer %+v", peer)
				}
			}
			if !slices.Equal(vx, tt.vxlan) || !slices.Equal(wg, tt.wireGuard) || len(p.byState) != len(tt.byState) {
				t.Fatalf("vxlan %v wireguard %v states %v; want %v %v %v", vx, wg, p.byState, tt.vxlan, tt.wireGuard, tt.byState)
			}
			for s, n := range tt.byState {
				if p.byState[s] != n {
					t.Errorf("%s: %d, want %d", s, p.byState[s], n)
				}
			}
			if tt.mode != "" && (p.desired.Source != netip.MustParseAddr("100.64.0.1") || !slices.Equal(p.desired.Unreachable, []netip.Prefix{netip.MustParsePrefix("10.128.0.0/9")})) {
				t.Errorf("source %s unreachable %v", p.desired.Source, p.desired.Unreachable)
			}
		})
	}
}

// TestWireGuardKeyRotationFiles: a rotation's key waits in its own file,
// is registered instead of the current one, survives a restart, and
// replaces the current key (file and all) once the signed record carries
// it; until then the current key serves.
func TestWireGuardKeyRotationFiles(t *testing.T) {
	dir := t.TempDir()
	open := func() *WireGuard {
		w, err := New(dir, Config{}, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	w := open()
	old := w.key
	next, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := wireguard.WritePendingKey(w.keyPath, next); err != nil {
		t.Fatal(err)
	}
	w = open() // restarted mid-rotation
	if got := w.RegisterKey(); got != next.PublicKey().String() {
		t.Fatalf("registers %s, want the pending key %s", got, next.PublicKey())
	}
	if k, ok := w.ownKey(old.PublicKey().String()); !ok || k != old {
		t.Fatalf("with the old key signed: %v %v, want the old key", k, ok)
	}
	if k, ok := w.ownKey(next.PublicKey().String()); !ok || k != next {
		t.Fatalf("with the new key signed: %v, want the new key", ok)
	}
	if _, err := os.Stat(wireguard.PendingKeyPath(w.keyPath, next)); !os.IsNotExist(err) {
		t.Errorf("the pending key file stays: %v", err)
	}
	if k, err := wireguard.LoadKey(filepath.Join(dir, KeyFile)); err != nil || k != next {
		t.Errorf("key file: %v, want the new key", err)
	}
	if _, ok := w.ownKey(old.PublicKey().String()); ok {
		t.Error("the old key still counts as this agent's after the rotation")
	}
	if w.rotations != 1 {
		t.Errorf("rotations %d, want 1", w.rotations)
	}
}
