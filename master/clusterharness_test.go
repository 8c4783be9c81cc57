package master

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/raftlog"
	"github.com/carve-net/carve/test/lab/testutil"
)

// The harness of the cluster tests: masters in this process, over real
// TCP on loopback.

// testCluster runs n masters in this process over real TCP on loopback,
// each with its own data dir; addresses stay fixed across restarts.
type testCluster struct {
	t         *testing.T
	cfg       api.NetworkConfig
	ids       []string
	dirs      []string
	raftAddrs []string
	httpAddrs []string
	masters   []*Master // nil when stopped
	mu        sync.Mutex
	// pki, when set, runs the masters with TLS and signing; nil: --insecure.
	pki *testPKI
	// plain is the clients' HTTP client without TLS (boundedClient).
	plain *http.Client
	// tune adjusts every master's options.
	tune []func(*Options)
}

func testLogger(t *testing.T) *slog.Logger {
	t.Helper()
	if os.Getenv("CARVE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// freeAddr returns a loopback address that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	return freeAddrs(t, 1)[0]
}

// freeAddrs returns n distinct free loopback addresses: the listeners are
// held until all n are chosen, so the kernel cannot hand out one port twice
// (closing each at once let two masters of one cluster get the same port).
func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	var addrs []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs
}

// addSlot gives the cluster one more master's id, data dir and addresses
// (not started) and returns its index.
func (c *testCluster) addSlot(id string) int {
	c.t.Helper()
	pair := freeAddrs(c.t, 2)
	c.ids = append(c.ids, id)
	c.dirs = append(c.dirs, c.t.TempDir())
	c.raftAddrs = append(c.raftAddrs, pair[0])
	c.httpAddrs = append(c.httpAddrs, pair[1])
	if len(c.masters) < len(c.ids) {
		c.masters = append(c.masters, nil)
	}
	return len(c.ids) - 1
}

func newTestCluster(t *testing.T, n int, cfg api.NetworkConfig) *testCluster {
	t.Helper()
	return newTestClusterWith(t, n, cfg, nil)
}

// newTestClusterWith starts n masters; with p, secured by its CA; tune
// adjusts their options.
func newTestClusterWith(t *testing.T, n int, cfg api.NetworkConfig, p *testPKI, tune ...func(*Options)) *testCluster {
	t.Helper()
	c := &testCluster{t: t, cfg: cfg, masters: make([]*Master, n), pki: p, tune: tune, plain: boundedClient(t, nil)}
	addrs := freeAddrs(t, 2*n)
	for i := range n {
		c.ids = append(c.ids, fmt.Sprintf("m%d", i+1))
		c.dirs = append(c.dirs, t.TempDir())
		c.raftAddrs = append(c.raftAddrs, addrs[2*i])
		c.httpAddrs = append(c.httpAddrs, addrs[2*i+1])
	}
	t.Cleanup(func() {
		for i := range c.masters {
			c.stop(i)
		}
	})
	for i := range n {
		c.start(i)
	}
	return c
}

func (c *testCluster) peers() []raftlog.Server {
	var out []raftlog.Server
	for i, id := range c.ids {
		if i >= 3 { // later nodes join
			break
		}
		out = append(out, raftlog.Server{ID: id, Address: c.raftAddrs[i], Voter: true})
	}
	return out
}

func (c *testCluster) options(i int) Options {
	opts := Options{
		ID: c.ids[i], DataDir: c.dirs[i], HTTPAddr: c.httpAddrs[i], RaftAddr: c.raftAddrs[i],
		Peers: c.peers(), Network: c.cfg, Logger: testLogger(c.t).With("node", c.ids[i]),
		// raftlog's defaults (1s heartbeat and election, 500ms lease): with
		// 300ms and 200ms, a leader starved of CPU (-race on two busy
		// cores) lost its lease and elections flapped, and the tests saw
		// 503 no_leader mid-way.
		TuneRaft: func(rc *raftlog.Config) {
			rc.HeartbeatTimeout = raftlog.DefaultHeartbeatTimeout
			rc.ElectionTimeout = raftlog.DefaultElectionTimeout
			rc.LeaderLeaseTimeout = raftlog.DefaultLeaderLeaseTimeout
		},
	}
	if c.pki == nil {
		opts.Insecure = true
	} else {
		opts.TLS = c.pki.Files(c.ids[i], pki.RoleMaster)
		opts.SigningKey = c.pki.SigningKey
	}
	for _, f := range c.tune {
		f(&opts)
	}
	return opts
}

func (c *testCluster) start(i int) {
	c.t.Helper()
	c.startWith(i, c.options(i))
}

func (c *testCluster) startWith(i int, opts Options) {
	c.t.Helper()
	var m *Master
	// The OS may hold a just-closed port for a moment.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := retry.Until(ctx, 100*time.Millisecond, func() error {
		var err error
		m, err = Start(context.Background(), opts)
		return err
	})
	if err != nil {
		c.t.Fatalf("start %s: %v", opts.ID, err)
	}
	c.mu.Lock()
	c.masters[i] = m
	c.mu.Unlock()
}

func (c *testCluster) stop(i int) {
	c.mu.Lock()
	m := c.masters[i]
	c.masters[i] = nil
	c.mu.Unlock()
	if m != nil {
		if err := m.Close(); err != nil && !errors.Is(err, raftlog.ErrClosed) {
			c.t.Logf("close %s: %v", c.ids[i], err)
		}
	}
}

func (c *testCluster) running() []*Master {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*Master
	for _, m := range c.masters {
		if m != nil {
			out = append(out, m)
		}
	}
	return out
}

// waitLeader waits until a running master leads and has committed the
// cluster id, its HTTP address and the configuration, and every running
// master has caught up and knows the leader's address; it returns the
// leader's index.
func (c *testCluster) waitLeader() int {
	c.t.Helper()
	leader := -1
	testutil.Eventually(c.t, 0, "a leader every master follows", func() error {
		leader = -1
		for i, m := range c.masters {
			if m != nil && m.node.IsLeader() {
				leader = i
			}
		}
		if leader < 0 {
			return errors.New("no leader")
		}
		lm := c.masters[leader]
		if _, ok := lm.table.Network(); !ok || lm.table.ClusterID() == "" {
			return fmt.Errorf("leader %s has not committed the cluster id and the configuration", c.ids[leader])
		}
		// every running master must have caught up and know the leader's
		// address to proxy
		for _, m := range c.running() {
			if _, ok := m.table.Server(c.ids[leader]); !ok || !m.node.IsCaughtUp() {
				return fmt.Errorf("%s has not caught up with leader %s", m.opts.ID, c.ids[leader])
			}
		}
		return nil
	})
	return leader
}

func (c *testCluster) urls() []string {
	scheme := "http://"
	if c.pki != nil {
		scheme = "https://"
	}
	var out []string
	for _, a := range c.httpAddrs {
		out = append(out, scheme+a)
	}
	return out
}

// client is a failover client starting at master first; with TLS, it
// holds an operator's certificate.
func (c *testCluster) client(first int) *apiclient.Client {
	c.t.Helper()
	return c.clientAs(first, "operator", pki.RoleOperator)
}

// onlyClient is an operator's client of master i alone (no failover).
func (c *testCluster) onlyClient(i int) *apiclient.Client {
	c.t.Helper()
	var opts apiclient.ClientOptions
	if c.pki != nil {
		opts.TLS = c.pki.ClientTLS("operator", pki.RoleOperator)
	}
	cl, err := apiclient.NewClientWith([]string{c.urls()[i]}, opts)
	if err != nil {
		c.t.Fatal(err)
	}
	return cl
}

// forEachSecurity runs a cluster test without TLS (--insecure) and with
// it (TLS, certificates and signed records), each in its own subtest.
func forEachSecurity(t *testing.T, test func(t *testing.T, p *testPKI)) {
	t.Run("insecure", func(t *testing.T) { test(t, nil) })
	t.Run("tls", func(t *testing.T) { test(t, newTestPKI(t)) })
}

// clientAs is a failover client starting at master first with the
// certificate of name and role (ignored without TLS).
func (c *testCluster) clientAs(first int, name string, role pki.Role) *apiclient.Client {
	c.t.Helper()
	urls := c.urls()
	rot := append(append([]string{}, urls[first%len(urls):]...), urls[:first%len(urls)]...)
	hc := c.plain
	if c.pki != nil {
		hc = c.pki.sharedHTTPClient(name, role)
	}
	cl, err := apiclient.NewClient(rot, hc)
	if err != nil {
		c.t.Fatal(err)
	}
	return cl
}

// waitConverged waits until every running master's table shows the same state.
func (c *testCluster) waitConverged() []byte {
	c.t.Helper()
	var state []byte
	testutil.Eventually(c.t, 0, "the masters to converge", func() error {
		state = nil
		for _, m := range c.running() {
			data, _, err := m.table.StateJSON("")
			if err != nil {
				return retry.Permanent(err)
			}
			if state != nil && !bytes.Equal(data, state) {
				return fmt.Errorf("%s differs", m.opts.ID)
			}
			state = data
		}
		if state == nil {
			return errors.New("no master running")
		}
		return nil
	})
	return state
}

// registerRetrying registers until acknowledged, keeping one request id
// across retries as a real agent would.
func registerRetrying(ctx context.Context, cl *apiclient.Client, req api.RegisterRequest) (*api.AgentInfo, error) {
	req.RequestID = api.NewRequestID()
	var info *api.AgentInfo
	err := callRetrying(ctx, func() (err error) {
		info, err = cl.Register(ctx, req)
		return err
	})
	return info, err
}

// callRetrying calls call until it succeeds or fails for good, retrying
// what a client retries (no leader, a timeout) with backoff: on a loaded
// machine a cluster may lose its leader in the middle of a test.
func callRetrying(ctx context.Context, call func() error) error {
	backoff := retry.Backoff{First: 100 * time.Millisecond, Max: time.Second}
	for {
		err := call()
		if err == nil {
			return nil
		}
		if !api.IsRetryable(err) || ctx.Err() != nil {
			return err
		}
		if !retry.Sleep(ctx, backoff.Next()) {
			return fmt.Errorf("%w (last error %v)", ctx.Err(), err)
		}
	}
}

type leaseKey struct{ subnet, vtepIP, mac string }

func leasesOf(a *api.AgentInfo) leaseKey {
	ov := a.Overlay("carve")
	if ov == nil || ov.Backend == nil {
		return leaseKey{}
	}
	return leaseKey{ov.Subnet, ov.Backend.VXLAN.VTEPIP, ov.Backend.VXLAN.VTEPMAC}
}

// checkNoDoubleLeases fails when two agents hold the same subnet, VTEP IP or MAC.
func checkNoDoubleLeases(t *testing.T, st *api.State) {
	t.Helper()
	seen := map[string]string{}
	for _, a := range st.Agents {
		for _, ov := range a.Overlays {
			keys := []string{"subnet " + ov.Subnet, "subnet6 " + ov.Subnet6}
			if ov.Backend != nil {
				keys = append(keys, "vtep "+ov.Backend.VXLAN.VTEPIP, "mac "+ov.Backend.VXLAN.VTEPMAC)
			}
			for _, k := range keys {
				if strings.HasSuffix(k, " ") {
					continue
				}
				if other, dup := seen[k]; dup && other != a.AgentID {
					t.Errorf("%s held by both %s and %s", k, other, a.AgentID)
				}
				seen[k] = a.AgentID
			}
		}
	}
}

// httpCall sends a raw request and decodes the JSON answer.
func httpCall(t *testing.T, method, url, contentType string, body io.Reader) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, data
}
