package wireguard

import (
	"bytes"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// fakeClient is a device that records the configurations it is given and
// applies their peers. handshakeOnConfigure makes every peer it puts in
// complete a handshake before ConfigureDevice returns (as a peer's first
// keepalive often does on a real device).
type fakeClient struct {
	dev                  wgtypes.Device
	configs              []wgtypes.Config
	handshakeOnConfigure bool
}

func (f *fakeClient) Device(string) (*wgtypes.Device, error) {
	d := f.dev
	d.Peers = slices.Clone(f.dev.Peers)
	return &d, nil
}

func (f *fakeClient) ConfigureDevice(_ string, cfg wgtypes.Config) error {
	f.configs = append(f.configs, cfg)
	for _, pc := range cfg.Peers {
		f.dev.Peers = slices.DeleteFunc(f.dev.Peers, func(p wgtypes.Peer) bool { return p.PublicKey == pc.PublicKey })
		if pc.Remove {
			continue
		}
		p := wgtypes.Peer{PublicKey: pc.PublicKey, Endpoint: pc.Endpoint, AllowedIPs: pc.AllowedIPs}
		if f.handshakeOnConfigure {
			p.LastHandshakeTime = time.Now()
		}
		f.dev.Peers = append(f.dev.Peers, p)
	}
	return nil
}

func (f *fakeClient) Close() error { return nil }

// testDevice is a Device on fc whose handshake timer never fires: the
// tests call rehandshakeNow themselves, after age.
func testDevice(t *testing.T, fc *fakeClient) *Device {
	t.Helper()
	d := &Device{name: "wg-test", client: fc, log: slog.New(slog.DiscardHandler), putIn: map[wgtypes.Key]putInPeer{}}
	// Reset re-arms this no-op: the check runs only when the test says.
	d.rehandshake = time.AfterFunc(time.Hour, func() {})
	t.Cleanup(func() { d.rehandshake.Stop() })
	return d
}

// age moves the device's notes and the fake's handshakes by -by: as if by
// had passed.
func age(d *Device, fc *fakeClient, by time.Duration) {
	for k, p := range d.putIn {
		p.at = p.at.Add(-by)
		if !p.sampledAt.IsZero() {
			p.sampledAt = p.sampledAt.Add(-by)
		}
		d.putIn[k] = p
	}
	for i := range fc.dev.Peers {
		if !fc.dev.Peers[i].LastHandshakeTime.IsZero() {
			fc.dev.Peers[i].LastHandshakeTime = fc.dev.Peers[i].LastHandshakeTime.Add(-by)
		}
	}
}

// putInAgain is the configuration that puts in peer key again: removed,
// then added with its endpoint, allowed IPs and keepalive (a new
// handshake at once).
func isPutInAgain(cfg wgtypes.Config, key wgtypes.Key) bool {
	ps := cfg.Peers
	return len(ps) == 2 && ps[0].PublicKey == key && ps[0].Remove && ps[1].PublicKey == key && !ps[1].Remove &&
		ps[1].Endpoint != nil && len(ps[1].AllowedIPs) == 2 && ps[1].ReplaceAllowedIPs &&
		ps[1].PersistentKeepaliveInterval != nil && *ps[1].PersistentKeepaliveInterval == Keepalive
}

func peerConfig(key wgtypes.Key) wgtypes.PeerConfig {
	return wgtypes.PeerConfig{PublicKey: key, Endpoint: &net.UDPAddr{IP: net.IPv4(198, 18, 0, 12), Port: 51820},
		ReplaceAllowedIPs: true, AllowedIPs: ipNets(prefixes("100.64.0.2/32", "10.128.2.0/24")), PersistentKeepaliveInterval: ptr(Keepalive)}
}

// TestRehandshake: a peer put in that has had no handshake since is put
// in again; one that has, one put in too recently and one that left the
// device are not.
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
	d := testDevice(t, fc)
	for k, at := range map[wgtypes.Key]time.Time{silent: now.Add(-2 * time.Second), talked: now.Add(-2 * time.Second), gone: now.Add(-2 * time.Second)} {
		d.putIn[k] = putInPeer{at: at, wait: RehandshakeAfter, phase: phaseCheck, sampledAt: now.Add(-500 * time.Millisecond)}
	}
	d.putIn[recent] = putInPeer{at: now, wait: RehandshakeAfter}
	d.rehandshakeNow()
	if len(fc.configs) != 1 || !isPutInAgain(fc.configs[0], silent) {
		t.Fatalf("configurations %+v, want one: the silent peer removed and put in again as it was", fc.configs)
	}
	if _, ok := d.putIn[recent]; !ok || len(d.putIn) != 2 {
		t.Errorf("still waiting for %v, want the recent peer and the silent one", d.putIn)
	}
	if p := d.putIn[silent]; p.wait != 2*RehandshakeAfter {
		t.Errorf("the silent peer is checked again after %s, want %s", p.wait, 2*RehandshakeAfter)
	}
}

// TestRehandshakeCountsHandshakeDuringConfigure: a peer whose first
// handshake completes before the configuration call that put it in
// returns (a rotation's usual case: the keepalive's handshake takes a
// round trip, the call longer) has had its handshake and is left alone.
// Before the fix the time noted was taken after the call, and the check
// tore that fresh session down a second later.
func TestRehandshakeCountsHandshakeDuringConfigure(t *testing.T) {
	fc := &fakeClient{handshakeOnConfigure: true}
	d := testDevice(t, fc)
	peer := mustKey(t).PublicKey()
	if err := d.configure(wgtypes.Config{Peers: []wgtypes.PeerConfig{peerConfig(peer)}}); err != nil {
		t.Fatal(err)
	}
	age(d, fc, 2*RehandshakeAfter)
	d.rehandshakeNow()
	age(d, fc, 2*sampleWindow) // no traffic: nothing to judge a session by
	d.rehandshakeNow()
	if len(fc.configs) != 1 {
		t.Fatalf("%d configurations, want only the one that put the peer in (it had its handshake): %+v", len(fc.configs), fc.configs[1:])
	}
	if len(d.putIn) != 0 {
		t.Errorf("still waiting for %v, want none", d.putIn)
	}
}

// TestRehandshakeAgain: a peer that gets no handshake is put in again
// after 1 s, and again after 2 s and 4 s more (the other side may be
// later than a second to take the new key), then left to WireGuard's own
// retries; one that gets its handshake on the way is left alone from
// then on. Before the fix a peer was put in again once only.
func TestRehandshakeAgain(t *testing.T) {
	for _, tc := range []struct {
		name string
		// answerAfter is the put-in-again after which the peer has its
		// handshake (0: never).
		answerAfter int
		want        int
	}{
		{name: "never answers", answerAfter: 0, want: 3},
		{name: "answers the second", answerAfter: 2, want: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc := &fakeClient{}
			d := testDevice(t, fc)
			peer := mustKey(t).PublicKey()
			if err := d.configure(wgtypes.Config{Peers: []wgtypes.PeerConfig{peerConfig(peer)}}); err != nil {
				t.Fatal(err)
			}
			putIns := 0
			for _, wait := range []time.Duration{RehandshakeAfter, 2 * RehandshakeAfter, 4 * RehandshakeAfter, 8 * RehandshakeAfter, 16 * RehandshakeAfter} {
				// Not due yet: nothing happens.
				age(d, fc, wait/2)
				d.rehandshakeNow()
				if got := len(fc.configs) - 1; got != putIns {
					t.Fatalf("put in again %d times before its check of %s was due, want %d", got, wait, putIns)
				}
				age(d, fc, wait/2)
				d.rehandshakeNow()
				putIns = len(fc.configs) - 1
				if putIns > 0 && !isPutInAgain(fc.configs[putIns], peer) {
					t.Fatalf("configuration %+v, want the peer put in again", fc.configs[putIns])
				}
				if putIns == tc.answerAfter {
					fc.dev.Peers[0].LastHandshakeTime = time.Now()
				}
			}
			if putIns != tc.want {
				t.Errorf("put in again %d times, want %d", putIns, tc.want)
			}
			if len(d.putIn) != 0 {
				t.Errorf("still waiting for %v, want none (WireGuard's retries from here on)", d.putIn)
			}
		})
	}
}

// TestRehandshakeOneSideFirst: two hosts that put each other in at the
// same moment (a key rotation) and get no handshake never put each other
// in again at the same moment: the side with the greater public key waits
// half a wait longer. Before the fix both did at 1, 3 and 7 s, and each
// time the two new initiations crossed again (7 s without a session in
// the lab).
func TestRehandshakeOneSideFirst(t *testing.T) {
	k1, k2 := mustKey(t), mustKey(t)
	if p1, p2 := k1.PublicKey(), k2.PublicKey(); bytes.Compare(p1[:], p2[:]) > 0 {
		k1, k2 = k2, k1
	}
	lower, upper := &fakeClient{dev: wgtypes.Device{PublicKey: k1.PublicKey()}}, &fakeClient{dev: wgtypes.Device{PublicKey: k2.PublicKey()}}
	dl, du := testDevice(t, lower), testDevice(t, upper)
	if err := dl.configure(wgtypes.Config{Peers: []wgtypes.PeerConfig{peerConfig(k2.PublicKey())}}); err != nil {
		t.Fatal(err)
	}
	if err := du.configure(wgtypes.Config{Peers: []wgtypes.PeerConfig{peerConfig(k1.PublicKey())}}); err != nil {
		t.Fatal(err)
	}
	const step = 100 * time.Millisecond
	var atLower, atUpper []time.Duration
	for now := step; now <= 20*time.Second; now += step {
		age(dl, lower, step)
		age(du, upper, step)
		nl, nu := len(lower.configs), len(upper.configs)
		dl.rehandshakeNow()
		du.rehandshakeNow()
		if len(lower.configs) > nl {
			atLower = append(atLower, now)
		}
		if len(upper.configs) > nu {
			atUpper = append(atUpper, now)
		}
		if len(lower.configs) > nl && len(upper.configs) > nu {
			t.Fatalf("both sides put each other in again %s after they were put in: the two initiations cross", now)
		}
	}
	t.Logf("put in again: the lower key's side after %v, the greater's after %v", atLower, atUpper)
	if len(atLower) != 3 || len(atUpper) != 3 || atLower[0] > atUpper[0] {
		t.Errorf("put in again after %v and %v, want three times each, the lower key's side first", atLower, atUpper)
	}
}

// TestRehandshakeOneSided: a peer put in is sampled half a wait after,
// and judged at its check; one whose session only sent since (crossing
// initiations can leave one side with a session the other does not hold,
// which WireGuard notices only after 15 s) is put in again, one that
// received too, or sent nothing, is left alone.
func TestRehandshakeOneSided(t *testing.T) {
	for _, tc := range []struct {
		name       string
		sent, recv int64
		putInAgain bool
	}{
		{name: "sends and receives nothing", sent: 2048, recv: 0, putInAgain: true},
		{name: "sends and receives", sent: 2048, recv: 1024, putInAgain: false},
		{name: "idle", sent: 0, recv: 0, putInAgain: false},
		{name: "only receives", sent: 0, recv: 1024, putInAgain: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc := &fakeClient{handshakeOnConfigure: true}
			d := testDevice(t, fc)
			peer := mustKey(t).PublicKey()
			if err := d.configure(wgtypes.Config{Peers: []wgtypes.PeerConfig{peerConfig(peer)}}); err != nil {
				t.Fatal(err)
			}
			fc.dev.Peers[0].ReceiveBytes, fc.dev.Peers[0].TransmitBytes = 92, 148 // the handshake
			age(d, fc, RehandshakeAfter/2)
			d.rehandshakeNow()
			if len(fc.configs) != 1 || d.putIn[peer].phase != phaseCheck {
				t.Fatalf("after its sample: %d configurations, waiting for %+v; want 1, the peer sampled", len(fc.configs), d.putIn)
			}
			fc.dev.Peers[0].TransmitBytes += tc.sent
			fc.dev.Peers[0].ReceiveBytes += tc.recv
			age(d, fc, RehandshakeAfter/2)
			d.rehandshakeNow()
			if got := len(fc.configs) == 2 && isPutInAgain(fc.configs[1], peer); got != tc.putInAgain {
				t.Errorf("put in again: %v, want %v (configurations %+v)", got, tc.putInAgain, fc.configs)
			}
			if _, waiting := d.putIn[peer]; waiting != tc.putInAgain {
				t.Errorf("still waiting: %v, want %v", waiting, tc.putInAgain)
			}
		})
	}
}

// TestRehandshakeLateHandshake: a peer whose handshake came after its
// sample is sampled again at its check, and judged a sampleWindow later
// (the sample would count the handshake's own packets).
func TestRehandshakeLateHandshake(t *testing.T) {
	fc := &fakeClient{}
	d := testDevice(t, fc)
	peer := mustKey(t).PublicKey()
	if err := d.configure(wgtypes.Config{Peers: []wgtypes.PeerConfig{peerConfig(peer)}}); err != nil {
		t.Fatal(err)
	}
	age(d, fc, RehandshakeAfter/2)
	d.rehandshakeNow() // the sample, before any handshake
	fc.dev.Peers[0].LastHandshakeTime = time.Now()
	fc.dev.Peers[0].ReceiveBytes, fc.dev.Peers[0].TransmitBytes = 92, 148
	age(d, fc, RehandshakeAfter/2)
	d.rehandshakeNow()
	if st := d.putIn[peer]; len(fc.configs) != 1 || st.phase != phaseWindow || st.rx != 92 || st.tx != 148 {
		t.Fatalf("at its check: %d configurations, waiting for %+v; want 1, the peer sampled again", len(fc.configs), d.putIn)
	}
	fc.dev.Peers[0].TransmitBytes += 4096 // pings into a session the other side lacks
	age(d, fc, sampleWindow)
	d.rehandshakeNow()
	if len(fc.configs) != 2 || !isPutInAgain(fc.configs[1], peer) {
		t.Errorf("configurations %+v, want the peer put in again (its session only sent)", fc.configs)
	}
}
