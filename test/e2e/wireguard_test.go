package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/testutil"
)

// Ports of the encryption tests' traffic: VXLAN's and WireGuard's (the
// network's defaults), and where the marked datagrams go (nothing
// listens: they cross the overlay anyway).
const (
	vxlanPort     = netconfig.DefaultVTEPPort
	wireGuardPort = api.DefaultWireGuardPort
	markerPort    = 9
)

// encryptedCluster starts a 3-host cluster (one master) whose network has
// encryption mode, with host 3's agent run with --wireguard=false (no key:
// the cleartext peer of a rolling enable), and a container on every host.
func encryptedCluster(ctx context.Context, t *testing.T, mode string) (*labcluster.Cluster, []*labcluster.Container) {
	t.Helper()
	netCfg := netconfig.Default()
	netCfg.Encryption = mode
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 3, Masters: 1, Prefix: prefix, Network: &netCfg})
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	h3 := c.Host(3)
	if err := c.StopAgent(ctx, h3); err != nil {
		t.Fatal(err)
	}
	if err := c.StartAgent(h3, "--wireguard=false"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, converge, "host 3's record without a WireGuard key", func() error {
		a, err := c.Client().Agent(ctx, h3.AgentID())
		if err != nil {
			return err
		}
		if a.Keys.WireGuard != "" {
			return fmt.Errorf("its record still carries %s", a.Keys.WireGuard)
		}
		return c.Converged(ctx)
	})
	return c, containerPerHost(ctx, t, c)
}

// TestEncryption is issue 21's encryption in the default mode on three
// hosts, two with keys and one without (host 3, as in a rolling enable):
//
//  1. Every container pings every other; the agents say which peer is
//     reached in the clear (status, metrics, carve state).
//  2. A capture of the underlay shows only WireGuard UDP between the keyed
//     hosts, none of their containers' addresses or payload, while the
//     keyless host's traffic is VXLAN in the clear (the capture's proof
//     that it would see a leak).
//  3. A key rotation of host 2 keeps pings from host 1 flowing (no gap of
//     more than a few seconds), and its peers follow the new key.
func TestEncryption(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	ctx := within(t, 4*converge)
	c, cts := encryptedCluster(ctx, t, api.EncryptionWireGuard)
	h1, h2, h3 := c.Host(1), c.Host(2), c.Host(3)
	step := func(name string, fn func(t *testing.T)) {
		t.Helper()
		if !t.Run(name, fn) {
			t.FailNow()
		}
	}

	step("ping and status", func(t *testing.T) {
		pingAll(ctx, t, cts)
		for _, h := range []*labcluster.Host{h1, h2} {
			testutil.Eventually(t, converge, h.Name+"'s wireguard status", func() error {
				st, err := c.AgentClient(h).WireGuard(ctx)
				if err != nil {
					return err
				}
				want := map[string]int{api.PeerKeyed: 1, api.PeerCleartext: 1}
				if st.Mode != api.EncryptionWireGuard || fmt.Sprint(st.Peers) != fmt.Sprint(want) ||
					len(st.Cleartext) != 1 || st.Cleartext[0] != h3.AgentID() || st.Error != "" {
					return fmt.Errorf("status %+v, want mode %s, peers %v, cleartext [%s]", st, api.EncryptionWireGuard, want, h3.AgentID())
				}
				if st.Implementation == "" || st.PublicKey == "" || st.PublicKey != st.RegisteredKey {
					return fmt.Errorf("status %+v: want an implementation and the registered key", st)
				}
				return nil
			})
			if got, err := agentMetric(ctx, c, h, `carve_wireguard_peers{state="cleartext"}`); err != nil || got != 1 {
				t.Errorf("%s: carve_wireguard_peers{state=\"cleartext\"} = %v (%v), want 1", h.Name, got, err)
			}
		}
		out, err := c.RunCarve(ctx, h1, append([]string{"state", "--masters", strings.Join(c.MasterURLs(), ",")}, c.OperatorArgs()...)...)
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("encryption wireguard: 2 of 3 agents keyed; without a key (cleartext): %s", h3.AgentID())
		if !strings.Contains(string(out), want) {
			t.Errorf("carve state lacks %q:\n%s", want, out)
		}
	})

	step("the underlay carries only WireGuard between keyed hosts", func(t *testing.T) {
		secret, clear := []byte("carve-e2e-secret-payload-1f3a"), []byte("carve-e2e-cleartext-payload-77c2")
		pkts := capture(ctx, t, c, func() {
			pingAll(ctx, t, cts)
			sendMarked(t, cts[0], cts[1], secret)
			sendMarked(t, cts[1], cts[0], secret)
			sendMarked(t, cts[0], cts[2], clear)
		}, func(pkts []labcluster.Packet) error {
			if !seen(pkts, clear, vxlanPort) {
				return fmt.Errorf("the cleartext payload to host 3 is not in the capture as VXLAN yet")
			}
			return nil
		})
		keyed := []netip.Addr{h1.IP().Addr(), h2.IP().Addr()}
		checkEncrypted(t, pkts, keyed, []*labcluster.Container{cts[0], cts[1]}, secret)
		// The control, which capture waited for: host 3's traffic is VXLAN,
		// its payload visible; the capture would show a leak.
	})

	step("key rotation keeps pings flowing", func(t *testing.T) {
		before, err := c.Client().Agent(ctx, h2.AgentID())
		if err != nil {
			t.Fatal(err)
		}
		p := startPinger(ctx, cts[0], cts[1].Addr.Addr())
		out, err := c.RunCarve(ctx, h1, append([]string{"agent", "rotate-wireguard-key", h2.AgentID(),
			"--masters", strings.Join(c.MasterURLs(), ",")}, c.OperatorArgs()...)...)
		if err != nil {
			p.stop()
			t.Fatal(err)
		}
		t.Logf("%s", out)
		var after *api.AgentInfo
		testutil.Eventually(t, converge, "host 1 follows host 2's new key", func() error {
			if after, err = c.Client().Agent(ctx, h2.AgentID()); err != nil {
				return err
			}
			if after.Keys.WireGuard == before.Keys.WireGuard {
				return fmt.Errorf("host 2's record still carries its old key")
			}
			st, err := c.AgentClient(h2).WireGuard(ctx)
			if err != nil {
				return err
			}
			if st.PublicKey != after.Keys.WireGuard || st.Rotations != 1 {
				return fmt.Errorf("host 2 holds %s after %d rotations, its record carries %s", st.PublicKey, st.Rotations, after.Keys.WireGuard)
			}
			return nil
		})
		if !strings.Contains(string(out), after.Keys.WireGuard) {
			t.Errorf("carve agent rotate-wireguard-key printed %q, not the new key %s", out, after.Keys.WireGuard)
		}
		// Pings go on for a while under the new key.
		p.waitReplies(t, 20)
		gap, sent, replies := p.stop()
		t.Logf("rotation: %d echoes, %d replies, longest gap without a reply %s (ending %s)", sent, replies, gap, p.gapEnd.Format(time.StampMilli))
		// Crossing handshakes of the two sides cost a second or two
		// (wireguard/rehandshake.go); WireGuard alone would take 5 s, or
		// 15 s when one side is left with a session the other lacks.
		if gap > 3*time.Second {
			t.Errorf("pings stopped for %s across the rotation, want at most 3s; the devices now:\n%s\n%s\n"+
				"(the agents' logs name the peers put in again for want of a handshake or of an answer)", gap, wireGuardState(h1), wireGuardState(h2))
		}
		pingAll(ctx, t, cts)
	})
}

// TestEncryptionStrict is issue 21's strict mode: host 3 has no key, so
// nothing goes to it or comes from it (dropped, never sent in the clear),
// while the keyed hosts talk through WireGuard.
func TestEncryptionStrict(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	ctx := within(t, 3*converge)
	c, cts := encryptedCluster(ctx, t, api.EncryptionWireGuardStrict)
	h1, h2 := c.Host(1), c.Host(2)
	if err := cts[0].NS.PingRetry(ctx, cts[1].Addr.Addr(), labcluster.PingAttempts); err != nil {
		t.Fatalf("keyed hosts: %v", err)
	}
	testutil.Eventually(t, converge, "host 1 counts host 3 as dropped", func() error {
		st, err := c.AgentClient(h1).WireGuard(ctx)
		if err != nil {
			return err
		}
		if st.Peers[api.PeerDropped] != 1 || st.Peers[api.PeerKeyed] != 1 {
			return fmt.Errorf("status %+v, want one keyed and one dropped peer", st)
		}
		return nil
	})
	secret := []byte("carve-e2e-strict-payload-93bd")
	pkts := capture(ctx, t, c, func() {
		for _, pair := range [][2]*labcluster.Container{{cts[0], cts[2]}, {cts[2], cts[0]}, {cts[1], cts[2]}} {
			if err := pair[0].NS.PingRetry(ctx, pair[1].Addr.Addr(), 2); err == nil {
				t.Errorf("%s reached %s: strict mode must drop traffic to and from a host without a key", pair[0], pair[1])
			}
			sendMarked(t, pair[0], pair[1], secret)
		}
		sendMarked(t, cts[0], cts[1], secret)
		if err := cts[0].NS.PingRetry(ctx, cts[1].Addr.Addr(), labcluster.PingAttempts); err != nil {
			t.Errorf("keyed hosts: %v", err)
		}
	}, func(pkts []labcluster.Packet) error {
		// The last ping's reply, encrypted, from host 2 to host 1.
		for _, p := range slices.Backward(pkts) {
			if p.Src == h2.IP().Addr() && p.Dst == h1.IP().Addr() && p.DstPort == wireGuardPort {
				return nil
			}
		}
		return fmt.Errorf("no WireGuard packet from host 2 to host 1 yet")
	})
	all := []netip.Addr{h1.IP().Addr(), h2.IP().Addr(), c.Host(3).IP().Addr()}
	checkEncrypted(t, pkts, all, cts, secret)
}

// capture runs traffic with a capture of the underlay around it, and
// stops it once the capture shows what traffic's last packets leave on
// the underlay (caught must then return nil).
func capture(ctx context.Context, t *testing.T, c *labcluster.Cluster, traffic func(), caught func([]labcluster.Packet) error) []labcluster.Packet {
	t.Helper()
	cp, err := c.StartCapture(ctx)
	if err != nil {
		testutil.Require(t, !strings.Contains(err.Error(), "needs tcpdump"), "%v", err)
		t.Fatal(err)
	}
	traffic()
	testutil.Eventually(t, converge, "the capture shows the traffic's last packets", func() error {
		pkts, err := cp.Packets()
		if err != nil {
			return err
		}
		return caught(pkts)
	})
	pkts, err := cp.Stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("captured %d IPv4 packets on the underlay", len(pkts))
	return pkts
}

// checkEncrypted fails when a packet between two of hosts is VXLAN or
// other UDP than WireGuard's, or carries a container's address or the
// secret anywhere in it; and when no WireGuard packet crossed at all.
func checkEncrypted(t *testing.T, pkts []labcluster.Packet, hosts []netip.Addr, cts []*labcluster.Container, secret []byte) {
	t.Helper()
	isHost := func(a netip.Addr) bool {
		for _, h := range hosts {
			if h == a {
				return true
			}
		}
		return false
	}
	wg, bad := 0, 0
	for _, p := range pkts {
		if bytes.Contains(p.Data, secret) {
			t.Errorf("the secret payload crossed the underlay in the clear: %s", p)
			bad++
		}
		if !isHost(p.Src) || !isHost(p.Dst) {
			continue
		}
		switch {
		case p.Proto == 17 && p.SrcPort == wireGuardPort && p.DstPort == wireGuardPort:
			wg++
		case p.Proto == 17:
			t.Errorf("UDP between hosts that is not WireGuard: %s", p)
			bad++
		case p.Proto != 6:
			t.Errorf("neither WireGuard nor the control plane's TCP between hosts: %s", p)
			bad++
		}
		for _, ct := range cts {
			if b := ct.Addr.Addr().As4(); bytes.Contains(p.Data[14:], b[:]) {
				t.Errorf("container %s's address crossed the underlay in the clear: %s", ct, p)
				bad++
			}
		}
		if bad > 10 {
			t.Fatal("too many leaks to list")
		}
	}
	if wg == 0 {
		t.Errorf("no WireGuard packet between the keyed hosts in %d captured", len(pkts))
	}
}

// seen tells whether a UDP packet to port carries payload.
func seen(pkts []labcluster.Packet, payload []byte, port uint16) bool {
	for _, p := range pkts {
		if p.Proto == 17 && p.DstPort == port && bytes.Contains(p.Data, payload) {
			return true
		}
	}
	return false
}

// sendMarked sends a few datagrams carrying marker from one container to
// another.
func sendMarked(t *testing.T, from, to *labcluster.Container, marker []byte) {
	t.Helper()
	if err := labcluster.SendUDP(from, to.Addr.Addr(), markerPort, marker, 5); err != nil {
		t.Fatal(err)
	}
}

// wireGuardState is h's WireGuard device as `wg show` tells it: its key,
// and each peer's key, endpoint and latest handshake.
func wireGuardState(h *labcluster.Host) string {
	c, err := wgctrl.New()
	if err != nil {
		return fmt.Sprintf("%s: %v", h.Name, err)
	}
	defer c.Close()
	d, err := c.Device(labcluster.WireGuardDevice(h))
	if err != nil {
		return fmt.Sprintf("%s: %v", h.Name, err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: device %s, public key %s", h.Name, d.Name, d.PublicKey)
	for _, p := range d.Peers {
		fmt.Fprintf(&b, "; peer %s at %s, latest handshake %s, received %d B, sent %d B",
			p.PublicKey, p.Endpoint, p.LastHandshakeTime.Format(time.StampMilli), p.ReceiveBytes, p.TransmitBytes)
	}
	return b.String()
}

// pinger pings one address from a container, one echo after another,
// and records the longest time without a reply (and when it ended).
type pinger struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu        sync.Mutex
	sent      int
	replies   int
	lastReply time.Time
	gap       time.Duration
	gapEnd    time.Time
}

func startPinger(ctx context.Context, from *labcluster.Container, dst netip.Addr) *pinger {
	ctx, cancel := context.WithCancel(ctx)
	p := &pinger{cancel: cancel, done: make(chan struct{}), lastReply: time.Now()}
	go func() {
		defer close(p.done)
		for ctx.Err() == nil {
			pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			err := from.NS.Ping(pctx, dst)
			cancel()
			p.mu.Lock()
			p.sent++
			if err == nil {
				now := time.Now()
				if now.Sub(p.lastReply) > p.gap {
					p.gap, p.gapEnd = now.Sub(p.lastReply), now
				}
				p.lastReply, p.replies = now, p.replies+1
			}
			p.mu.Unlock()
		}
	}()
	return p
}

// waitReplies waits for n more replies.
func (p *pinger) waitReplies(t *testing.T, n int) {
	t.Helper()
	p.mu.Lock()
	want := p.replies + n
	p.mu.Unlock()
	testutil.Eventually(t, converge, fmt.Sprintf("%d more ping replies", n), func() error {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.replies < want {
			return fmt.Errorf("%d of %d replies", p.replies, want)
		}
		return nil
	})
}

// stop ends the pings and returns the longest gap between replies (the
// time since the last one included), the echoes sent and the replies.
func (p *pinger) stop() (time.Duration, int, int) {
	p.cancel()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return max(p.gap, time.Since(p.lastReply)), p.sent, p.replies
}

// TestEncryptionEnable turns encryption on and off again on a running
// two-host cluster, as operations.md tells: the masters' configuration
// file changes and the master restarts; the agents follow, the pings
// pass at every stage, and turning it off leaves no WireGuard device or
// route of carve's behind.
func TestEncryptionEnable(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	ctx := within(t, 4*converge)
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 2, Masters: 1, Prefix: prefix})
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cts := containerPerHost(ctx, t, c)
	pingAll(ctx, t, cts)
	for _, stage := range []struct {
		mode  string
		keyed int
	}{{api.EncryptionWireGuard, 1}, {"", 0}} {
		netCfg := c.Network()
		netCfg.Encryption = stage.mode
		if err := c.ApplyConfig(ctx, c.Host(1), netCfg); err != nil {
			t.Fatal(err)
		}
		for _, h := range c.Hosts() {
			testutil.Eventually(t, converge, fmt.Sprintf("%s follows encryption %q", h.Name, stage.mode), func() error {
				st, err := c.AgentClient(h).WireGuard(ctx)
				if err != nil {
					return err
				}
				if st.Mode != stage.mode || st.Peers[api.PeerKeyed] != stage.keyed || st.Error != "" || (st.Device == "") != (stage.mode == "") {
					return fmt.Errorf("status %+v, want mode %q with %d keyed peers", st, stage.mode, stage.keyed)
				}
				dev := labcluster.WireGuardDevice(h)
				out, err := exec.CommandContext(ctx, "ip", "-n", h.NS.Name, "route", "show", "proto", "203").CombinedOutput()
				if err != nil {
					return fmt.Errorf("ip route: %v: %s", err, out)
				}
				routes := string(out)
				if stage.mode == "" && routes != "" {
					return fmt.Errorf("routes of carve's WireGuard stay after it was turned off:\n%s", routes)
				}
				if stage.mode != "" && (!strings.Contains(routes, "dev "+dev) || !strings.Contains(routes, "unreachable 10.128.0.0/9")) {
					return fmt.Errorf("want routes through %s and the overlay's unreachable route, have:\n%s", dev, routes)
				}
				return nil
			})
		}
		// Both agents key their peer within milliseconds of each other:
		// a first handshake may cross a device not up yet, and WireGuard
		// tries again (the agent puts an unanswered peer in again after
		// a second). Pings pass once it has.
		testutil.Eventually(t, converge, "pings across hosts with encryption "+strconv.Quote(stage.mode), func() error {
			return labcluster.Ping(ctx, cts).Err()
		})
		pingAll(ctx, t, cts)
	}
}
