package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/netnslab"
	"github.com/carve-net/carve/test/lab/testutil"
)

// switchLossLimit is how many echoes of a 100 ms stream a mode switch may
// lose per direction: a second's worth (issue 29). An echo is lost when no
// reply comes within switchReplyWait: one that comes late (the machine
// loaded, the agents reconciling beside -race and busy loops) was not
// lost, and waiting one interval counted it so (a streak run saw 11).
const (
	switchPingInterval = 100 * time.Millisecond
	switchLossLimit    = 10
	switchReplyWait    = 2 * time.Second
)

// mixedUnderlay puts the cluster's host 1 behind a router, on its own
// /31, and hosts 2 and 3 on one /31 of the underlay bridge: 2 and 3 share
// a segment, 1 is reached through the router. Before Start.
func mixedUnderlay(t *testing.T, c *labcluster.Cluster) {
	t.Helper()
	r, err := c.Lab.AddRouter(netip.MustParsePrefix("198.18.1.1/15"))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.MoveBehind(c.Host(1).NS, 31); err != nil {
		t.Fatal(err)
	}
	for _, h := range []*labcluster.Host{c.Host(2), c.Host(3)} {
		if err := r.NarrowSegment(h.NS, 31); err != nil {
			t.Fatal(err)
		}
	}
}

// waitModes waits until every host's agent reports each peer in the mode
// want gives for the pair (its /overlay-agent/peers).
func waitModes(ctx context.Context, t *testing.T, c *labcluster.Cluster, want func(from, to *labcluster.Host) string) {
	t.Helper()
	byID := map[string]*labcluster.Host{}
	for _, h := range c.Hosts() {
		byID[h.AgentID()] = h
	}
	for _, h := range c.Hosts() {
		testutil.Eventually(t, converge, h.Name+"'s peer modes", func() error {
			ps, err := c.AgentClient(h).Peers(ctx)
			if err != nil {
				return err
			}
			if len(ps.Peers) != len(byID)-1 {
				return fmt.Errorf("%d peers, want %d", len(ps.Peers), len(byID)-1)
			}
			for _, p := range ps.Peers {
				o := byID[p.AgentID]
				if o == nil {
					return fmt.Errorf("unknown peer %s", p.AgentID)
				}
				if w := want(h, o); p.Mode != w || !p.Programmed {
					return fmt.Errorf("peer %s (%s): mode %q programmed %v, want %q programmed", o.Name, p.AgentID, p.Mode, p.Programmed, w)
				}
			}
			return nil
		})
	}
}

// TestRoutedMixed is issue 29's mixed cluster: hosts 2 and 3 on one
// underlay segment, host 1 behind a router, dataplane "routed".
//
//  1. Every container pings every other; 2 and 3 route each other's blocks
//     via their underlay IPs (their agents say "routed", the metric counts
//     one, the kernel's route to the other's container goes via its
//     underlay IP on eth0), and both reach host 1 through VXLAN.
//  2. Switching the network to VXLAN and back (carve config apply) loses
//     at most a second of a 100 ms ping stream between 2 and 3 each way,
//     counted in lost echoes (a count, not a time: at most
//     switchLossLimit of the stream's echoes, which runs a second before
//     the switch and a second after every agent reports the new mode).
func TestRoutedMixed(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	ctx := within(t, 5*converge)
	netCfg := netconfig.Default()
	netCfg.Dataplane = api.DataplaneRouted
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 3, Masters: 1, Prefix: prefix, Network: &netCfg})
	mixedUnderlay(t, c)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cts := containerPerHost(ctx, t, c)
	h1, h2, h3 := c.Host(1), c.Host(2), c.Host(3)
	segment := func(from, to *labcluster.Host) string {
		if from != h1 && to != h1 {
			return api.DataplaneRouted
		}
		return api.DataplaneVXLAN
	}
	allVXLAN := func(_, _ *labcluster.Host) string { return api.DataplaneVXLAN }
	step := func(name string, fn func(t *testing.T)) {
		t.Helper()
		if !t.Run(name, fn) {
			t.FailNow()
		}
	}

	step("mixed: pings everywhere, 2 and 3 routed", func(t *testing.T) {
		waitModes(ctx, t, c, segment)
		pingAll(ctx, t, cts)
		for _, h := range []*labcluster.Host{h1, h2, h3} {
			want := 1.0
			if h == h1 {
				want = 0
			}
			if got, err := agentMetric(ctx, c, h, `carve_agent_peers_by_mode{mode="routed"}`); err != nil || got != want {
				t.Errorf("%s: carve_agent_peers_by_mode{mode=\"routed\"} = %v (%v), want %v", h.Name, got, err, want)
			}
			// The pings between 2's and 3's containers went through the
			// agents' eBPF fast path, straight into the containers; host
			// 1 has no routed peer to shortcut.
			for _, name := range []string{"carve_agent_fastpath_packets_total", "carve_agent_fastpath_container_packets_total"} {
				got, err := agentMetric(ctx, c, h, name)
				if err != nil || (h == h1) != (got == 0) {
					t.Errorf("%s: %s = %v (%v), want %s", h.Name, name, got, err, map[bool]string{true: "0", false: "more than 0"}[h == h1])
				}
			}
		}
		checkRoute(t, h2, cts[2].Addr.Addr(), h3.IP().Addr(), netnslab.HostLink)
		checkRoute(t, h3, cts[1].Addr.Addr(), h2.IP().Addr(), netnslab.HostLink)
		checkRoute(t, h2, cts[0].Addr.Addr(), netip.Addr{}, c.Network().VTEPName)
		// The operator sees the same in carve ipam show, with the fast
		// path's state beside the routed peers (each agent's
		// /overlay-agent/peers).
		args := append([]string{"ipam", "show", "--masters", strings.Join(c.MasterURLs(), ",")}, c.OperatorArgs()...)
		out, err := c.RunCarve(ctx, h1, args...)
		if err != nil {
			t.Fatalf("carve ipam show: %v\n%s", err, out)
		}
		for _, line := range [][3]string{
			{h1.AgentID(), api.DataplaneVXLAN, h2.AgentID() + "," + h3.AgentID()},
			{h2.AgentID(), api.DataplaneRouted + " (fast path on)", h3.AgentID()}, {h2.AgentID(), api.DataplaneVXLAN, h1.AgentID()},
			{h3.AgentID(), api.DataplaneRouted + " (fast path on)", h2.AgentID()}, {h3.AgentID(), api.DataplaneVXLAN, h1.AgentID()},
		} {
			if !regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(line[0]) + `\s+` + regexp.QuoteMeta(line[1]) + `\s+` + regexp.QuoteMeta(line[2]) + `$`).Match(out) {
				t.Errorf("carve ipam show lacks the data path line %q:\n%s", strings.Join(line[:], " "), out)
			}
		}
	})

	for _, sw := range []struct {
		name      string
		dataplane string
		modes     func(from, to *labcluster.Host) string
	}{
		{"switch to vxlan", api.DataplaneVXLAN, allVXLAN},
		{"switch back to routed", api.DataplaneRouted, segment},
	} {
		step(sw.name, func(t *testing.T) {
			streams := []*pingStream{startPingStream(ctx, cts[1], cts[2]), startPingStream(ctx, cts[2], cts[1])}
			for _, s := range streams {
				s.waitSent(t, 10) // a second of the stream before the switch
			}
			cfg := c.Network()
			cfg.Dataplane = sw.dataplane
			if err := c.ApplyConfig(ctx, h1, cfg); err != nil {
				t.Fatal(err)
			}
			waitModes(ctx, t, c, sw.modes)
			if sw.dataplane == api.DataplaneRouted {
				checkRoute(t, h2, cts[2].Addr.Addr(), h3.IP().Addr(), netnslab.HostLink)
			} else {
				checkRoute(t, h2, cts[2].Addr.Addr(), netip.Addr{}, c.Network().VTEPName)
			}
			for _, s := range streams {
				s.waitSent(t, 10) // and a second after: a path broken for good shows as loss
			}
			for _, s := range streams {
				sent, lost := s.stop()
				t.Logf("%s: %d echoes sent every %s across the switch, %d lost", s.label, sent, switchPingInterval, lost)
				if lost > switchLossLimit {
					t.Errorf("%s: %d of %d echoes lost, want at most %d (a second)", s.label, lost, sent, switchLossLimit)
				}
			}
			pingAll(ctx, t, cts)
		})
	}
}

// pingStream sends one echo every switchPingInterval from a container to
// another, each waiting up to switchReplyWait for its answer (the next
// goes out meanwhile), and counts the echoes sent and lost.
type pingStream struct {
	label  string
	cancel context.CancelFunc
	done   chan struct{}
	echoes sync.WaitGroup // the echoes waiting for their answers

	mu         sync.Mutex
	sent, lost int
}

func startPingStream(ctx context.Context, from, to *labcluster.Container) *pingStream {
	sending, cancel := context.WithCancel(ctx)
	s := &pingStream{label: from.Label() + " -> " + to.Label(), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(switchPingInterval)
		defer tick.Stop()
		for {
			s.mu.Lock()
			s.sent++
			s.mu.Unlock()
			s.echoes.Go(func() {
				// Not cut short when the stream stops sending: ctx is the test's.
				pctx, pcancel := context.WithTimeout(ctx, switchReplyWait)
				defer pcancel()
				if err := from.NS.Ping(pctx, to.Addr.Addr()); err != nil {
					s.mu.Lock()
					s.lost++
					s.mu.Unlock()
				}
			})
			select {
			case <-sending.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// waitSent waits until n more echoes were sent.
func (s *pingStream) waitSent(t *testing.T, n int) {
	t.Helper()
	s.mu.Lock()
	want := s.sent + n
	s.mu.Unlock()
	testutil.Eventually(t, converge, fmt.Sprintf("%s: %d more echoes", s.label, n), func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.sent < want {
			return fmt.Errorf("%d of %d sent", s.sent, want)
		}
		return nil
	})
}

// stop ends the stream, waits for the answers of the echoes sent, and
// returns the echoes sent and lost.
func (s *pingStream) stop() (sent, lost int) {
	s.cancel()
	<-s.done
	s.echoes.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent, s.lost
}

// checkRoute checks h's route to dst: via gw (none: any) out of dev.
func checkRoute(t *testing.T, h *labcluster.Host, dst, gw netip.Addr, dev string) {
	t.Helper()
	nh, err := h.NS.Netlink()
	if err != nil {
		t.Fatal(err)
	}
	rs, err := nh.RouteGet(dst.AsSlice())
	if err != nil || len(rs) != 1 {
		t.Fatalf("%s: route to %s: %v %v", h.Name, dst, rs, err)
	}
	l, err := nh.LinkByIndex(rs[0].LinkIndex)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := netip.AddrFromSlice(rs[0].Gw)
	if l.Attrs().Name != dev || (gw.IsValid() && got.Unmap() != gw) {
		t.Errorf("%s: route to %s via %v dev %s, want via %v dev %s", h.Name, dst, got, l.Attrs().Name, gw, dev)
	}
}
