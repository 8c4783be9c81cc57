package e2e

// Issue 27's replays: faults operators found, each caused again on a lab
// cluster the way it happened, with what the operator saw checked against
// what they should have seen. Each fails on the build before its fix (the
// commit named in its comment).

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/labcluster"
	"github.com/carve-net/carve/test/lab/testutil"
)

// pinnedConfig is a network configuration unlike the built-in default: an
// overlay of another name and subnet, and MTUs pinned below what the
// underlay allows.
func pinnedConfig() api.NetworkConfig {
	return api.NetworkConfig{VTEPMTU: 1400, OverlayMTU: 1380,
		Overlays: []api.OverlayNetwork{{Name: "prod", Subnet: "10.64.0.0/16", Prefix: 24}}}
}

// TestReplayEmptyConfigLeader is issue 27's first finding: one master
// restarted with CARVE_CONFIG= (empty: the built-in default) committed that
// default once it led; the real overlay became enabled: false, a default
// overlay appeared and the MTU pins vanished. Fixed by f1a570f (the
// committed configuration is the one authority). Here master m3 restarts
// with an empty --config and is made the leader (its log made the only
// up-to-date one: the others are stopped in turn, so that an election can
// only pick it). The committed configuration stays the cluster's, carve
// config show prints it, carve cluster status warns that m3's file
// differs, and the containers still ping each other with the pinned MTU.
func TestReplayEmptyConfigLeader(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	cfg := pinnedConfig()
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 3, Masters: 3, Prefix: prefix, Network: &cfg})
	ctx := within(t, 6*converge)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	committed := c.Network() // the file with its defaults, as the first leader committed it
	var cs []*labcluster.Container
	for _, h := range c.Hosts() {
		ct, err := c.AddCNIContainer(ctx, h, "prod", labcluster.CNIOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, ct)
	}
	pingAll(ctx, t, cs)

	m3 := c.Masters()[2]
	if err := c.StopMaster(ctx, m3); err != nil {
		t.Fatal(err)
	}
	if err := c.StartMasterWith(m3, "--config", ""); err != nil { // CARVE_CONFIG= in the unit's env file
		t.Fatal(err)
	}
	leadAlone(ctx, t, c, m3)

	// The committed configuration is the cluster's, whichever master leads.
	testutil.Eventually(t, converge, "the masters' state keeps the committed network configuration", func() error {
		st, err := c.Client().State(ctx, apiclient.StateOptions{Consistent: true})
		if err != nil {
			return err
		}
		if jsonOf(st.Network) != jsonOf(committed) {
			return fmt.Errorf("the state's network configuration is\n%s\nwant the committed one\n%s", jsonOf(st.Network), jsonOf(committed))
		}
		return nil
	})
	out, err := c.RunCarve(ctx, c.Host(1), append([]string{"config", "show", "--masters", strings.Join(c.MasterURLs(), ",")}, c.OperatorArgs()...)...)
	if err != nil {
		t.Fatal(err)
	}
	var shown api.NetworkConfig
	if err := json.Unmarshal(out, &shown); err != nil {
		t.Fatalf("carve config show: %v\n%s", err, out)
	}
	if jsonOf(shown) != jsonOf(committed) {
		t.Errorf("carve config show prints\n%s\nwant the committed configuration\n%s", out, jsonOf(committed))
	}
	// Healthy (the masters were restarted: once they caught up), with a
	// warning that m3's file differs.
	testutil.Eventually(t, converge, "carve cluster status says m3's file differs", func() error {
		out, healthy := clusterStatus(ctx, t, c)
		if !healthy || !strings.Contains(out, "warning: master m3 (") || !strings.Contains(out, "--config file differs") {
			return fmt.Errorf("carve cluster status (healthy %v) does not say that m3's file differs:\n%s", healthy, out)
		}
		return nil
	})
	// The agents still run the overlay with its pinned MTU.
	for _, h := range c.Hosts() {
		info, err := c.WaitAgent(ctx, h)
		if err != nil {
			t.Fatal(err)
		}
		if len(info.Overlays) != 1 || info.Overlays[0].Info.Name != "prod" || !info.Overlays[0].Info.IsEnabled() {
			t.Errorf("%s runs overlays %+v, want prod enabled alone", h.Name, info.Overlays)
		}
		for link, want := range map[string]int{committed.VTEPName: cfg.VTEPMTU, "m-prod": cfg.OverlayMTU} {
			if got, err := h.NS.LinkMTU(link); err != nil || got != want {
				t.Errorf("%s: %s MTU %d (%v), want the pinned %d", h.Name, link, got, err, want)
			}
		}
	}
	pingAll(ctx, t, cs)
}

// jsonOf renders v indented: for messages, and to compare configurations
// as the wire has them (a pointer and its value, nil and empty, alike).
func jsonOf(v any) string {
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b)
}

// leadAlone makes m the leader by making its log the only up-to-date one:
// the leader (when it is not m) stops; the next leader, if it is not m
// either, commits an entry of its own term on m (a consistent read's
// barrier: only the two of them run, so it needs m) and stops too; the
// first master stopped starts again, and since its log lacks that entry it
// cannot win an election against m. Every master runs again at the end.
func leadAlone(ctx context.Context, t *testing.T, c *labcluster.Cluster, m *labcluster.Master) {
	t.Helper()
	testutil.Eventually(t, converge, m.ID+" follows a leader, caught up", func() error {
		cl, err := apiclient.NewClient([]string{m.URL()}, c.HTTPClient())
		if err != nil {
			return err
		}
		st, err := cl.ClusterStatus(ctx)
		if err != nil {
			return err
		}
		if !st.CaughtUp || st.Leader == nil || st.Leader.ID == "" {
			return fmt.Errorf("%s: caught up %v, leader %+v", m.ID, st.CaughtUp, st.Leader)
		}
		return nil
	})
	first, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if first == m {
		return
	}
	if err := c.StopMaster(ctx, first); err != nil {
		t.Fatal(err)
	}
	second, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if second != m {
		// An entry of the new term, committed by the two that run: m
		// holds it, first does not.
		if _, err := c.State(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.StopMaster(ctx, second); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.StartMaster(first); err != nil {
		t.Fatal(err)
	}
	leader, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if leader != m {
		t.Fatalf("%s leads, want %s", leader.ID, m.ID)
	}
	if !second.Running() {
		if err := c.StartMaster(second); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%s leads", m.ID)
}

// TestReplayAgentRestartReachable is issue 27's fifth finding: after every
// restart an agent reported the masters unreachable for about 30 s, its
// first read of their state a long poll (at the index its data dir held,
// which the masters had not passed) that they held for the whole watch
// wait. Fixed by 6739645 (the first read is a probe). Here host 2's agent
// restarts on its data dir with a recording proxy of the masters in front
// of m1 (its only --masters, on the host's loopback, with a master
// certificate for it): the first read of the state the masters see from it
// does not wait, the agent reports them reachable and has programmed its
// peers, and the containers ping.
func TestReplayAgentRestartReachable(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 3, Masters: 3, Prefix: prefix})
	ctx := within(t, 4*converge)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cs := containerPerHost(ctx, t, c)
	pingAll(ctx, t, cs)
	h := c.Host(2)
	proxy := startMasterProxy(t, c, h, c.Masters()[0])
	if err := c.StopAgent(ctx, h); err != nil {
		t.Fatal(err)
	}
	if err := c.StartAgent(h, "--masters", proxy.url); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, converge, h.Name+" reports the masters reachable", func() error {
		p, err := c.AgentClient(h).Peers(ctx)
		if err != nil {
			return err
		}
		if !p.MastersReachable {
			return fmt.Errorf("%s: masters_reachable false; requests through the proxy: %v", h.Name, proxy.requests())
		}
		return nil
	})
	reads := proxy.reads()
	if len(reads) == 0 {
		t.Fatalf("the masters saw no read of their state from %s, yet it reports them reachable; requests: %v", h.Name, proxy.requests())
	}
	if first, _ := url.Parse(reads[0]); first.Query().Has("wait") && first.Query().Get("wait") != "0s" {
		t.Errorf("the first read of the masters' state from the restarted agent is %s: a long poll, which masters at its index hold for the whole wait (reads: %v)", reads[0], reads)
	}
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	pingAll(ctx, t, cs)
}

// masterProxy is a TLS reverse proxy of one master on a host's loopback,
// presenting a master certificate for 127.0.0.1 to the agent and the
// agent's own certificate to the master; it records the request URIs.
type masterProxy struct {
	url string
	mu  sync.Mutex
	log []string // "METHOD URI", in arrival order
}

// startMasterProxy serves the proxy in h's namespace until the test ends.
func startMasterProxy(t *testing.T, c *labcluster.Cluster, h *labcluster.Host, m *labcluster.Master) *masterProxy {
	t.Helper()
	name := "proxy-" + h.Name
	loopback := netip.MustParseAddr("127.0.0.1")
	if err := pki.Issue(c.PKIDir(), pki.IssueRequest{Role: pki.RoleMaster, Name: name, IPs: []netip.Addr{loopback}}); err != nil {
		t.Fatal(err)
	}
	serverTLS, err := pki.Files{CA: filepath.Join(c.PKIDir(), pki.CAFile), Cert: pki.CertFile(c.PKIDir(), name), Key: pki.KeyFile(c.PKIDir(), name)}.ServerConfig(false)
	if err != nil {
		t.Fatal(err)
	}
	upstream, err := c.HTTPClientAs(c.AgentFiles(h))
	if err != nil {
		t.Fatal(err)
	}
	target, err := url.Parse(m.URL())
	if err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	if err := h.NS.Namespace.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(loopback, 0).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	p := &masterProxy{url: "https://" + ln.Addr().String()}
	rp := &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport:     upstream.Transport,
		FlushInterval: -1,
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.log = append(p.log, r.Method+" "+r.URL.RequestURI())
		p.mu.Unlock()
		rp.ServeHTTP(w, r)
	}), TLSConfig: serverTLS}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	return p
}

// requests are the requests seen so far.
func (p *masterProxy) requests() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.log...)
}

// reads are the URIs of the reads of the state (whole or changes) seen
// so far, in order.
func (p *masterProxy) reads() []string {
	var out []string
	for _, r := range p.requests() {
		uri, ok := strings.CutPrefix(r, http.MethodGet+" ")
		if ok && (strings.HasPrefix(uri, "/overlay-master/state") || strings.HasPrefix(uri, "/overlay-master/changes")) {
			out = append(out, uri)
		}
	}
	return out
}

// TestReplayFullDiskFollower is issue 27's sixth finding: a master whose
// disk was full logged `no space left on device` and fell behind while
// carve cluster status said healthy. 4b9a098 made a master 5,000 or more
// entries behind its leader's commit a problem, which a quiet cluster
// takes long to reach; a master now probes its data dir (master/health.go)
// and says at once that it cannot write it. Here m3's data dir is a small
// tmpfs, filled up once the cluster runs: carve cluster status exits 1
// naming m3 before any write; writes (configuration applies that change
// nothing) go on until m3's log says no space left on device, the status
// still naming m3. With the space freed, m3 catches up and the status is
// healthy again.
func TestReplayFullDiskFollower(t *testing.T) {
	t.Parallel() // its own cluster: see the package comment
	c := labcluster.ForTest(t, labcluster.Options{Hosts: 3, Masters: 3, Prefix: prefix})
	m3 := c.Masters()[2]
	disk := testutil.SmallDisk(t, m3.DataDir, "16m")
	ctx := within(t, 6*converge)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	filler := disk.Fill(t)
	// At once, before any write: m3's own probe of its data dir.
	testutil.Eventually(t, converge, "carve cluster status reports that m3 cannot write its data dir", func() error {
		out, healthy := clusterStatus(ctx, t, c)
		return problems("master m3 ("+m3.URL()+"): cannot write its --data-dir")(out, healthy)
	})
	// Writes: m3's Raft log cannot take them.
	out := driveUntil(ctx, t, c, c.Masters()[:2], "m3 fails to append, and carve cluster status reports it", func(out string, healthy bool) error {
		if !strings.Contains(m3.Tail(500), "no space left on device") {
			return fmt.Errorf("m3's log does not say no space left on device:\n%s", m3.Tail(5))
		}
		return problems("master m3 (")(out, healthy)
	})
	t.Logf("carve cluster status with m3's disk full:\n%s", out)
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	waitHealthy(ctx, t, c)
}

// clusterStatus runs carve cluster status from host 1 as an operator and
// returns its output and whether it exited 0.
func clusterStatus(ctx context.Context, t *testing.T, c *labcluster.Cluster, extra ...string) (string, bool) {
	t.Helper()
	args := append([]string{"cluster", "status", "--masters", strings.Join(c.MasterURLs(), ",")}, c.OperatorArgs()...)
	out, err := c.RunCarve(ctx, c.Host(1), append(args, extra...)...)
	if err != nil && !strings.Contains(err.Error(), "exit status 1") {
		t.Fatalf("carve cluster status: %v\n%s", err, out)
	}
	return string(out), err == nil
}

// driveUntil commits writes (the committed network configuration applied
// again: an entry that changes nothing) through the masters via (not the
// one that is behind: each logs the change asked for) until cond accepts
// the output of carve cluster status, and returns that output.
func driveUntil(ctx context.Context, t *testing.T, c *labcluster.Cluster, via []*labcluster.Master, what string, cond func(status string, healthy bool) error) string {
	t.Helper()
	cfg := c.Network()
	var urls []string
	for _, m := range via {
		urls = append(urls, m.URL())
	}
	client, err := c.ClientAs(c.OperatorFiles(), urls...)
	if err != nil {
		t.Fatal(err)
	}
	var out string
	testutil.Eventually(t, 4*converge, what, func() error {
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for range 16 {
			wg.Go(func() {
				for range 64 {
					if _, err := client.ApplyConfig(ctx, cfg, false); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			return err
		}
		var healthy bool
		out, healthy = clusterStatus(ctx, t, c)
		return cond(out, healthy)
	})
	return out
}

// problems is a cond of driveUntil: carve cluster status exits 1 with a
// problem line holding each of want.
func problems(want ...string) func(string, bool) error {
	return func(out string, healthy bool) error {
		for _, w := range want {
			if healthy || !problemNaming(out, w) {
				return fmt.Errorf("carve cluster status (healthy %v) has no problem naming %q:\n%s", healthy, w, out)
			}
		}
		return nil
	}
}

// problemNaming tells whether the report has a problem line holding want.
func problemNaming(out, want string) bool {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "problem: ") && strings.Contains(l, want) {
			return true
		}
	}
	return false
}

// waitHealthy waits until carve cluster status exits 0.
func waitHealthy(ctx context.Context, t *testing.T, c *labcluster.Cluster) {
	t.Helper()
	testutil.Eventually(t, 2*converge, "carve cluster status healthy", func() error {
		if out, ok := clusterStatus(ctx, t, c); !ok {
			return fmt.Errorf("not healthy:\n%s", out)
		}
		return nil
	})
}
