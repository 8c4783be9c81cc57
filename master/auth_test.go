package master

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/raftlog"
	"github.com/carve-net/carve/test/lab/testutil"
)

// secureCall sends a request with hc and returns the status and body.
func secureCall(t *testing.T, hc *http.Client, method, url, body string, header map[string]string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data
}

// refusals sums carve_master_auth_refusals_total{reason} over the masters.
func refusals(c *testCluster, reason string) float64 {
	var sum float64
	for _, m := range c.running() {
		var mt dto.Metric
		_ = m.metrics.authRefusals.WithLabelValues(reason).Write(&mt)
		sum += mt.GetCounter().GetValue()
	}
	return sum
}

// The 401/403 matrix, with real TLS clients against a three-master
// cluster, asked of the leader and of a follower (which authorizes before
// it forwards, and whose forwarded requests the leader authorizes as the
// original client).
func TestAuthorizationMatrix(t *testing.T) {
	t.Parallel() // its own masters: loopback ports, data dirs; it mostly waits on Raft
	if testing.Short() {
		t.Skip("cluster test")
	}
	p := newTestPKI(t)
	c := newTestClusterWith(t, 3, netconfig.Default(), p)
	leader := c.waitLeader()
	follower := (leader + 1) % 3
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	op := c.client(leader)
	for i, id := range []string{"victim", "gone-leader", "gone-follower", "bulk-leader", "bulk-follower"} {
		if _, err := op.Register(ctx, api.RegisterRequest{AgentID: id, IP: fmt.Sprintf("198.18.2.%d", i+1)}); err != nil {
			t.Fatalf("operator registers %s: %v", id, err)
		}
	}
	clients := map[string]*http.Client{
		"none":     p.httpClient("", ""),
		"no-role":  tlsHTTPClient(t, p.withoutRole()),
		"agent":    agentClient(p, "a1", "198.18.1.1"),
		"operator": p.httpClient("operator", pki.RoleOperator),
		"master":   p.httpClient(c.ids[0], pki.RoleMaster),
	}
	asAgentViaMaster := map[string]string{identityHeader: "agent/a1"}
	type authCase struct {
		name, who, method, path, body string
		header                        map[string]string
		status                        int
		code, mention                 string
	}
	forbidden := func(name, method, path, body, mention string) authCase {
		return authCase{name: name, who: "agent", method: method, path: path, body: body, status: 403, code: api.CodeForbidden, mention: mention}
	}
	cases := func(target string) []authCase {
		return []authCase{
			{name: "no certificate reads the state", who: "none", method: "GET", path: "/overlay-master/state", status: 401, code: api.CodeUnauthenticated, mention: "no client certificate"},
			{name: "no certificate deletes", who: "none", method: "DELETE", path: "/overlay-master/agents/victim", status: 401, code: api.CodeUnauthenticated, mention: "--cert-file"},
			{name: "no certificate joins", who: "none", method: "POST", path: "/cluster/join", body: `{"id":"m7","raft_addr":"127.0.0.1:2"}`, status: 401, code: api.CodeUnauthenticated, mention: "no client certificate"},
			{name: "no certificate, unknown path", who: "none", method: "GET", path: "/nothing", status: 401, code: api.CodeUnauthenticated},
			{name: "no certificate, healthz is open", who: "none", method: "GET", path: "/healthz", status: 200},
			{name: "no certificate, metrics are open", who: "none", method: "GET", path: "/metrics", status: 200},
			{name: "certificate without a carve role", who: "no-role", method: "GET", path: "/overlay-master/state", status: 401, code: api.CodeUnauthenticated, mention: `"no-role" carries no carve role`},

			{name: "agent registers itself", who: "agent", method: "POST", path: "/overlay-master/agents", body: `{"agent_id":"a1","ip":"198.18.1.1"}`, status: 200},
			{name: "agent registers another host's IP", who: "agent", method: "POST", path: "/overlay-master/agents", body: `{"agent_id":"a1","ip":"198.18.2.1"}`,
				status: 403, code: api.CodeForbidden, mention: "may not register ip 198.18.2.1: its certificate names only 127.0.0.1, 198.18.1.1"},
			{name: "agent registers its own mesh_addr", who: "agent", method: "POST", path: "/overlay-master/agents", body: `{"agent_id":"a1","ip":"198.18.1.1","mesh_addr":"198.18.1.1:6783"}`, status: 200},
			{name: "agent registers another host's mesh_addr", who: "agent", method: "POST", path: "/overlay-master/agents", body: `{"agent_id":"a1","ip":"198.18.1.1","mesh_addr":"198.18.2.1:6783"}`,
				status: 403, code: api.CodeForbidden, mention: "may not register mesh_addr 198.18.2.1:6783: its certificate names only 127.0.0.1, 198.18.1.1"},
			{name: "agent registers a mesh_addr by name", who: "agent", method: "POST", path: "/overlay-master/agents", body: `{"agent_id":"a1","ip":"198.18.1.1","mesh_addr":"victim.example:6783"}`,
				status: 403, code: api.CodeForbidden, mention: `its host "victim.example" is not an IP`},
			{name: "agent reads the state", who: "agent", method: "GET", path: "/overlay-master/state", status: 200},
			{name: "agent watches the state", who: "agent", method: "GET", path: "/overlay-master/state?index=1&wait=50ms", status: 200},
			{name: "agent reads another record", who: "agent", method: "GET", path: "/overlay-master/agents/victim", status: 200},
			{name: "agent reads the cluster status", who: "agent", method: "GET", path: "/cluster/status", status: 200},
			forbidden("agent registers another id", "POST", "/overlay-master/agents", `{"agent_id":"victim","ip":"198.18.1.2"}`,
				`role agent may not register agent_id "victim": the certificate of agent "a1" registers only agent_id "a1"`),
			forbidden("agent deletes another agent", "DELETE", "/overlay-master/agents/victim", "",
				"role agent may not DELETE /overlay-master/agents/{id}: needs an operator or master certificate"),
			forbidden("agent deletes itself", "DELETE", "/overlay-master/agents/a1", "", "role agent may not DELETE /overlay-master/agents/{id}"),
			forbidden("agent bulk-deletes", "POST", "/overlay-master/agents/delete", `{"agents":["victim"]}`, "role agent may not POST /overlay-master/agents/delete"),
			forbidden("agent joins a voter", "POST", "/cluster/join", `{"id":"m7","raft_addr":"127.0.0.1:2"}`, "role agent may not POST /cluster/join"),
			forbidden("agent removes a server", "DELETE", "/cluster/servers/"+c.ids[2], "", "role agent may not DELETE /cluster/servers/{id}"),
			forbidden("agent reads through the leader", "GET", "/overlay-master/state?consistent=true", "", "consistent=true"),
			{name: "agent claims an operator's identity", who: "agent", method: "DELETE", path: "/overlay-master/agents/victim",
				header: map[string]string{identityHeader: "operator/admin"}, status: 403, code: api.CodeForbidden, mention: "role agent may not DELETE"},
			{name: "master forwards an agent's delete", who: "master", method: "DELETE", path: "/overlay-master/agents/victim",
				header: asAgentViaMaster, status: 403, code: api.CodeForbidden, mention: "role agent may not DELETE"},
			{name: "master forwards an agent's registration of another id", who: "master", method: "POST", path: "/overlay-master/agents",
				body: `{"agent_id":"victim","ip":"198.18.1.3"}`, header: asAgentViaMaster, status: 403, code: api.CodeForbidden, mention: `agent_id "victim"`},

			{name: "operator registers any id", who: "operator", method: "POST", path: "/overlay-master/agents", body: `{"agent_id":"a2-` + target + `","ip":"198.18.3.` + map[string]string{"leader": "1", "follower": "2"}[target] + `"}`, status: 200},
			{name: "operator deletes", who: "operator", method: "DELETE", path: "/overlay-master/agents/gone-" + target, status: 200},
			{name: "operator bulk-deletes", who: "operator", method: "POST", path: "/overlay-master/agents/delete", body: `{"agents":["bulk-` + target + `"]}`, status: 200},
			{name: "operator reads through the leader", who: "operator", method: "GET", path: "/overlay-master/state?consistent=true", status: 200},
			{name: "operator joins a voter", who: "operator", method: "POST", path: "/cluster/join", body: `{"id":"m9-` + target + `","raft_addr":"` + freeAddr(t) + `"}`, status: 200},
			{name: "operator removes a server", who: "operator", method: "DELETE", path: "/cluster/servers/m9-" + target, status: 200},
			{name: "master deletes", who: "master", method: "DELETE", path: "/overlay-master/agents/a2-" + target, status: 200},
		}
	}
	for _, target := range []int{leader, follower} {
		name := map[bool]string{true: "leader", false: "follower"}[target == leader]
		for _, tc := range cases(name) {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				status, data := secureCall(t, clients[tc.who], tc.method, "https://"+c.httpAddrs[target]+tc.path, tc.body, tc.header)
				if status != tc.status {
					t.Fatalf("status %d, want %d: %s", status, tc.status, data)
				}
				if tc.code == "" {
					return
				}
				var e api.Error
				if err := json.Unmarshal(data, &e); err != nil || e.Code != tc.code || !strings.Contains(e.Message, tc.mention) {
					t.Errorf("answer %s: want code %q and a message with %q", data, tc.code, tc.mention)
				}
			})
		}
	}
	// The refusals changed nothing; the operator's requests did.
	if _, err := op.Agent(ctx, "victim"); err != nil {
		t.Errorf("victim after the refused deletes: %v", err)
	}
	for _, gone := range []string{"gone-leader", "gone-follower", "bulk-leader", "bulk-follower", "a2-leader", "a2-follower"} {
		if _, err := op.Agent(ctx, gone); !api.IsCode(err, api.CodeNotFound) {
			t.Errorf("%s after the operator's delete: %v, want not found", gone, err)
		}
	}
	if cs, err := op.ClusterStatus(ctx); err != nil || len(cs.Servers) != 3 {
		t.Errorf("servers after join and remove: %+v %v", cs, err)
	}
	// Each refusal is counted once, by the master that refused it (a
	// follower refuses before forwarding).
	for reason, want := range map[string]float64{refusedNoCertificate: 10, refusedRole: 16, refusedWrongAgent: 4, refusedWrongIP: 2, refusedWrongMeshAddr: 4} {
		if got := refusals(c, reason); got != want {
			t.Errorf("carve_master_auth_refusals_total{reason=%q} = %v over the masters, want %v", reason, got, want)
		}
	}
}

// A client certificate of another CA fails the handshake, a client
// without the CA cannot trust the master, and the api client says which
// flag fixes each.
func TestClientTrustFailures(t *testing.T) {
	t.Parallel() // its own masters: loopback ports, data dirs; it mostly waits on Raft
	if testing.Short() {
		t.Skip("cluster test")
	}
	p := newTestPKI(t)
	c := newTestClusterWith(t, 1, netconfig.Default(), p)
	c.waitLeader()
	foreign := newTestPKI(t)
	foreignCert := foreign.ClientTLS("operator", pki.RoleOperator)
	foreignCert.RootCAs = p.ClientTLS("", "").RootCAs // it trusts the master; the master does not trust it
	tests := []struct {
		name    string
		tls     *apiclient.ClientOptions
		mention string
	}{
		{"certificate of another CA", &apiclient.ClientOptions{TLS: foreignCert}, "--cert-file and --key-file"},
		{"no CA given", &apiclient.ClientOptions{}, "--ca-file"},
		{"another CA given", &apiclient.ClientOptions{TLS: foreign.ClientTLS("", "")}, "--ca-file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cl, err := apiclient.NewClientWith(c.urls(), *tt.tls)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, err = cl.State(ctx, apiclient.StateOptions{})
			if !errors.Is(err, api.ErrUntrusted) || api.IsRetryable(err) || !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("state: %v; want a permanent ErrUntrusted naming %s", err, tt.mention)
			}
		})
	}
	// The operator's own client works.
	if _, err := c.client(0).State(context.Background(), apiclient.StateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// A master whose certificate comes from another CA cannot join: its join
// request fails the handshake, and added as a voter by an operator, it
// receives nothing over Raft.
func TestForeignMasterCannotJoin(t *testing.T) {
	t.Parallel() // its own masters: loopback ports, data dirs; it mostly waits on Raft
	if testing.Short() {
		t.Skip("cluster test")
	}
	p := newTestPKI(t)
	c := newTestClusterWith(t, 3, netconfig.Default(), p)
	leader := c.waitLeader()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.client(leader).Register(ctx, api.RegisterRequest{AgentID: "a1", IP: "198.18.0.1"}); err != nil {
		t.Fatal(err)
	}

	foreign := newTestPKI(t)
	c.addSlot("m4")
	opts := c.options(3)
	opts.TLS = foreign.Files("m4", pki.RoleMaster)
	opts.TLS.CA = p.CAFile() // it trusts the cluster; the cluster does not trust it
	opts.SigningKey = foreign.SigningKey
	opts.Peers = nil // it waits to be added (a --peers without it would be a typo in --id: refused)
	c.startWith(3, opts)
	m4 := c.masters[3]

	cl, err := apiclient.NewClientWith([]string{c.urls()[leader]}, apiclient.ClientOptions{TLS: m4.security.client})
	if err != nil {
		t.Fatal(err)
	}
	err = cl.Join(ctx, api.JoinRequest{ID: "m4", RaftAddr: m4.RaftAddr(), HTTPAddr: m4.HTTPAddr()})
	if !errors.Is(err, api.ErrUntrusted) {
		t.Fatalf("join with a foreign certificate: %v, want refused in the handshake", err)
	}

	// The operator's client from here on names the three trusted masters
	// only: c.client's list now ends in m4, and a moment without a leader
	// while m4 joins (a loaded machine) would fail it over to m4, whose
	// certificate the operator rightly refuses for good.
	trusted, err := apiclient.NewClient(c.urls()[:3], p.sharedHTTPClient("operator", pki.RoleOperator))
	if err != nil {
		t.Fatal(err)
	}
	lm := c.masters[leader]
	before := raftTLSFailures(t, lm, "outgoing")
	if err := trusted.Join(ctx, api.JoinRequest{ID: "m4", RaftAddr: m4.RaftAddr()}); err != nil {
		t.Fatalf("operator adds m4: %v", err)
	}
	testutil.Eventually(t, 0, "the leader to fail its Raft handshakes with m4", testutil.True(func() bool {
		return raftTLSFailures(t, lm, "outgoing") >= before+2
	}))
	if _, err := trusted.Register(ctx, api.RegisterRequest{AgentID: "a2", IP: "198.18.0.2"}); err != nil {
		t.Fatal(err)
	}
	if m4.table.ClusterID() != "" || m4.table.AgentCount() != 0 || m4.node.IsCaughtUp() {
		t.Errorf("m4 got the cluster's state: cluster id %q, %d agents", m4.table.ClusterID(), m4.table.AgentCount())
	}
	if err := trusted.RemoveServer(ctx, "m4"); err != nil {
		t.Fatal(err)
	}
}

func raftTLSFailures(t *testing.T, m *Master, direction string) float64 {
	t.Helper()
	mfs, err := m.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "carve_raft_tls_handshake_failures_total" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "direction" && l.GetValue() == direction {
					return mt.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatal("carve_raft_tls_handshake_failures_total is not exported")
	return 0
}

// A master refuses to start without TLS unless told --insecure, and says
// which flag is missing.
func TestStartNeedsTLSOrInsecure(t *testing.T) {
	p := newTestPKI(t)
	master := p.Files("m1", pki.RoleMaster)
	agent := p.Files("a1", pki.RoleAgent)
	tests := []struct {
		name    string
		set     func(*Options)
		mention string
	}{
		{"nothing", func(o *Options) {}, "--ca-file, --cert-file, --key-file (or --insecure"},
		{"no key", func(o *Options) { o.TLS = pki.Files{CA: master.CA, Cert: master.Cert}; o.SigningKey = p.SigningKey }, "--key-file"},
		{"insecure with TLS", func(o *Options) { o.Insecure = true; o.TLS = master }, "--insecure contradicts"},
		{"agent certificate", func(o *Options) { o.TLS = agent; o.SigningKey = p.SigningKey }, "role agent; a master needs role master"},
		{"no signing key", func(o *Options) { o.TLS = master }, "--signing-key-file is required"},
		// Issue 20, finding 2: it was a WARN.
		{"another master's certificate", func(o *Options) { o.TLS = p.Files("m2", pki.RoleMaster); o.SigningKey = p.SigningKey },
			`is the certificate of master "m2", and this master is --id "m1"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := Options{ID: "m1", DataDir: t.TempDir(), HTTPAddr: "127.0.0.1:0", RaftAddr: "127.0.0.1:0",
				Peers: []raftlog.Server{{ID: "m1", Address: "127.0.0.1:1"}}, Network: netconfig.Default(), Logger: testLogger(t)}
			tt.set(&opts)
			m, err := Start(context.Background(), opts)
			if err == nil {
				m.Close()
				t.Fatal("started")
			}
			if !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("error %q does not mention %q", err, tt.mention)
			}
		})
	}
}

// The blocking watch outlasts the server's read and write timeouts: its
// handler extends its own deadlines.
func TestWatchOutlastsServerTimeouts(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	p := newTestPKI(t)
	c := &testCluster{t: t, cfg: netconfig.Default(), masters: make([]*Master, 1), pki: p}
	c.ids, c.dirs = []string{"m1"}, []string{t.TempDir()}
	pair := freeAddrs(t, 2)
	c.raftAddrs, c.httpAddrs = []string{pair[0]}, []string{pair[1]}
	t.Cleanup(func() { c.stop(0) })
	opts := c.options(0)
	opts.HTTPServer.ReadTimeout, opts.HTTPServer.WriteTimeout = 300*time.Millisecond, 300*time.Millisecond
	c.startWith(0, opts)
	c.waitLeader()
	p.IssueAgent("a1", netip.MustParseAddr("198.18.0.1"))
	cl := c.clientAs(0, "a1", pki.RoleAgent)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := cl.State(ctx, apiclient.StateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	st2, err := cl.State(ctx, apiclient.StateOptions{Index: st.Index, Wait: 1500 * time.Millisecond})
	if err != nil {
		t.Fatalf("watch of 1.5s with 300ms server timeouts: %v", err)
	}
	if waited := time.Since(start); st2.Index != st.Index || waited < 1500*time.Millisecond {
		t.Errorf("watch answered index %d after %s; want the unchanged %d after its wait", st2.Index, waited, st.Index)
	}
	// And a write that wakes it is seen.
	woke := make(chan error, 1)
	go func() {
		st3, err := cl.State(ctx, apiclient.StateOptions{Index: st.Index, Wait: 20 * time.Second})
		if err == nil && st3.Index == st.Index {
			err = fmt.Errorf("watch returned the unchanged index %d", st3.Index)
		}
		woke <- err
	}()
	if _, err := cl.Register(ctx, api.RegisterRequest{AgentID: "a1", IP: "198.18.0.1"}); err != nil {
		t.Fatal(err)
	}
	if err := <-woke; err != nil {
		t.Fatal(err)
	}
}

// --insecure is said at start, as a warning.
func TestInsecureWarnsAtStart(t *testing.T) {
	var logs testutil.Logs
	raftAddr := freeAddr(t)
	m, err := Start(context.Background(), Options{
		ID: "m1", DataDir: t.TempDir(), HTTPAddr: "127.0.0.1:0", RaftAddr: raftAddr,
		Peers:   []raftlog.Server{{ID: "m1", Address: raftAddr, Voter: true}},
		Network: netconfig.Default(), Insecure: true,
		Logger: logs.Logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if !logs.Has(slog.LevelWarn, InsecureWarning) {
		t.Errorf("start log of an insecure master lacks the warning %q", InsecureWarning)
	}
	if !strings.HasPrefix(m.URL(), "http://") {
		t.Errorf("URL %s of an insecure master", m.URL())
	}
}
