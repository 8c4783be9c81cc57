package wireguard

import (
	"log/slog"
	"net"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// fakeClient is a device that records the configurations it is given.
type fakeClient struct {
	dev     wgtypes.Device
	configs []wgtypes.Config
}

func (f *fakeClient) Device(string) (*wgtypes.Device, error) { d := f.dev; return &d, nil }
func (f *fakeClient) ConfigureDevice(_ string, cfg wgtypes.Config) error {
	f.configs = append(f.configs, cfg)
	return nil
}
func (f *fakeClient) Close() error { return nil }

// TestRehandshake: a peer put in that has had no handshake since is put
// in again (removed and added with its endpoint, allowed IPs and
// keepalive: a new handshake at once); one that has, one put in too
// recently and one that left the device are not.
func TestRehandshake(t *testing.T) {
	silent, talked, recent, gone := mustKey(t).PublicKey(), mustKey(t).PublicKey(), mustKey(t).PublicKey(), mustKey(t).PublicKey()
	now := time.Now()
	ep := &net.UDPAddr{IP: net.IPv4(198, 18, 0, 12), Port: 51820}
	allowed := ipNets(prefixes("100.64.0.2/32", "10.128.2.0/24"))
	fc := &fakeClient{dev: wgtypes.Device{Peers: []wgtypes.Peer{
		{PublicKey: silent, Endpoint: ep, AllowedIPs: allowed},
		{PublicKey: talked, Endpoint: ep, LastHandshakeTime: now.Add(-time.Second)},
		{PublicKey: recent, Endpoint: ep},
	}}}
	d := &Device{name: "wg-test", client: fc, log: slog.New(slog.DiscardHandler), putIn: map[wgtypes.Key]time.Time{
		silent: now.Add(-2 * time.Second), talked: now.Add(-2 * time.Second), recent: now, gone: now.Add(-2 * time.Second),
	}}
	d.rehandshake = time.AfterFunc(time.Hour, func() {})
	t.Cleanup(func() { d.rehandshake.Stop() })
	d.rehandshakeNow()
	if len(fc.configs) != 1 {
		t.Fatalf("%d configurations, want 1", len(fc.configs))
	}
	peers := fc.configs[0].Peers
	if len(peers) != 2 || peers[0].PublicKey != silent || !peers[0].Remove || peers[1].PublicKey != silent || peers[1].Remove ||
		peers[1].Endpoint != ep || len(peers[1].AllowedIPs) != 2 || !peers[1].ReplaceAllowedIPs ||
		peers[1].PersistentKeepaliveInterval == nil || *peers[1].PersistentKeepaliveInterval != Keepalive {
		t.Fatalf("configuration %+v, want the silent peer removed and put in again as it was", peers)
	}
	if _, ok := d.putIn[recent]; !ok || len(d.putIn) != 1 {
		t.Errorf("still waiting for %v, want only the recent peer", d.putIn)
	}
}
