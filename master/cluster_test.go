package master

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/test/lab/testutil"
)

func TestClusterRegistrationsThroughLeaderFailover(t *testing.T) {
	t.Parallel() // its own masters: loopback ports, data dirs; it mostly waits on Raft
	if testing.Short() {
		t.Skip("cluster test")
	}
	forEachSecurity(t, testRegistrationsThroughLeaderFailover)
}

func testRegistrationsThroughLeaderFailover(t *testing.T, p *testPKI) {
	c := newTestClusterWith(t, 3, netconfig.Default(), p)
	leader := c.waitLeader()

	const agents = 500
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var acked sync.Map // agent id -> *api.AgentInfo
	var ackCount atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, agents)
	for i := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := c.client(i) // spread over all masters
			req := api.RegisterRequest{AgentID: fmt.Sprintf("agent-%03d", i), Hostname: fmt.Sprintf("h%d", i),
				IP: fmt.Sprintf("198.18.%d.%d", i/200, i%200+1), NetworkConfig: api.AgentNetworkConfig{MesosBridge: true, DockerBridge: true}}
			info, err := registerRetrying(ctx, cl, req)
			if err != nil {
				errs <- fmt.Errorf("%s: %w", req.AgentID, err)
				return
			}
			acked.Store(req.AgentID, info)
			ackCount.Add(1)
		}()
	}
	// Stop the leader once registrations are flowing: 500 clients' first
	// TLS handshakes under the race detector can take most of a loaded
	// machine's minute, so the wait is bounded by the test's own deadline.
	testutil.Eventually(t, 2*time.Minute, "50 acknowledged registrations", testutil.True(func() bool { return ackCount.Load() >= 50 }))
	t.Logf("stopping leader %s after %d acknowledgements", c.ids[leader], ackCount.Load())
	c.stop(leader)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	newLeader := c.waitLeader()
	if newLeader == leader {
		t.Fatalf("stopped leader still leads")
	}
	t.Logf("new leader %s; %d registrations acknowledged", c.ids[newLeader], ackCount.Load())

	var st *api.State
	if err := callRetrying(ctx, func() (err error) {
		st, err = c.client(newLeader).State(ctx, apiclient.StateOptions{Consistent: true})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(st.Agents) != agents {
		t.Errorf("state holds %d agents, want %d", len(st.Agents), agents)
	}
	byID := map[string]api.AgentInfo{}
	for _, a := range st.Agents {
		byID[a.AgentID] = a
	}
	acked.Range(func(k, v any) bool {
		a, ok := byID[k.(string)]
		if !ok {
			t.Errorf("acknowledged %s is missing", k)
			return true
		}
		if got, want := leasesOf(&a), leasesOf(v.(*api.AgentInfo)); got != want {
			t.Errorf("%s: state has %+v, acknowledgement said %+v", k, got, want)
		}
		return true
	})
	checkNoDoubleLeases(t, st)

	// The old leader comes back and catches up to the same state.
	c.start(leader)
	c.waitConverged()

	// Registering every agent again returns identical leases.
	for i := range agents {
		id := fmt.Sprintf("agent-%03d", i)
		before, _ := acked.Load(id)
		// The old leader's return may cost an election on a loaded
		// machine: retried as an agent retries.
		info, err := registerRetrying(ctx, c.client(i), api.RegisterRequest{AgentID: id, Hostname: fmt.Sprintf("h%d", i),
			IP: fmt.Sprintf("198.18.%d.%d", i/200, i%200+1), NetworkConfig: api.AgentNetworkConfig{MesosBridge: true, DockerBridge: true}})
		if err != nil {
			t.Fatalf("re-register %s: %v", id, err)
		}
		if before == nil || !reflect.DeepEqual(info, before) {
			t.Errorf("re-register %s: got %+v, first answer %+v", id, info, before)
		}
	}
	idx := st.Index
	var st2 *api.State
	if err := callRetrying(ctx, func() (err error) {
		st2, err = c.client(0).State(ctx, apiclient.StateOptions{Consistent: true})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if st2.Index != idx {
		t.Errorf("unchanged re-registrations moved the state index %d -> %d", idx, st2.Index)
	}
}

func TestClusterRestartFromDataDirs(t *testing.T) {
	t.Parallel() // its own masters: loopback ports, data dirs; it mostly waits on Raft
	if testing.Short() {
		t.Skip("cluster test")
	}
	cfg := netconfig.WithDefaults(api.NetworkConfig{Overlays: []api.OverlayNetwork{api.OverlayNetwork{Name: "carve", Subnet: "10.128.0.0/9", Prefix: 24},
		api.OverlayNetwork{Name: "six", Subnet6: "fd00::/48", Prefix6: 64}}})
	for _, snapshot := range []bool{false, true} {
		t.Run(fmt.Sprintf("snapshot=%v", snapshot), func(t *testing.T) {
			c := newTestCluster(t, 3, cfg)
			leader := c.waitLeader()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cl := c.client(leader)
			for i := range 40 {
				if _, err := registerRetrying(ctx, cl, api.RegisterRequest{AgentID: fmt.Sprintf("a%02d", i), IP: fmt.Sprintf("198.18.0.%d", i+1)}); err != nil {
					t.Fatal(err)
				}
				if snapshot && i == 20 {
					for _, m := range c.running() {
						if err := m.node.TakeSnapshot(); err != nil {
							t.Fatalf("snapshot: %v", err)
						}
					}
				}
			}
			if _, err := cl.DeleteAgents(ctx, []string{"a05", "198.18.0.8"}); err != nil {
				t.Fatal(err)
			}
			before := c.waitConverged()
			for i := range c.masters {
				c.stop(i)
			}
			for i := range c.masters {
				c.start(i)
			}
			c.waitLeader()
			after := c.waitConverged()
			if !bytes.Equal(before, after) {
				t.Fatalf("state after restart differs:\nbefore %s\nafter  %s", before, after)
			}
			if snapshot {
				for _, m := range c.running() {
					if m.node.Status().LastSnapshotIndex == 0 {
						t.Errorf("%s restarted without its snapshot", m.opts.ID)
					}
				}
			}
		})
	}
}

func TestHTTPBadInput(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	c := newTestCluster(t, 3, netconfig.Default())
	leader := c.waitLeader()
	ctx := context.Background()
	if _, err := c.client(leader).Register(ctx, api.RegisterRequest{AgentID: "known", IP: "198.18.0.1"}); err != nil {
		t.Fatal(err)
	}
	before := c.waitConverged()
	follower := (leader + 1) % 3
	huge := `{"agent_id":"x","ip":"198.18.0.1","hostname":"` + strings.Repeat("a", MaxBodyBytes) + `"}`
	tests := []struct {
		name, method, path, body string
		status                   int
		code, mention            string
	}{
		{"malformed JSON", "POST", "/overlay-master/agents", `{"agent_id": "a",`, 400, api.CodeBadRequest, "malformed JSON"},
		{"not an object", "POST", "/overlay-master/agents", `[1,2]`, 400, api.CodeBadRequest, "want"},
		{"empty body", "POST", "/overlay-master/agents", ``, 400, api.CodeBadRequest, "empty body"},
		{"unknown field", "POST", "/overlay-master/agents", `{"agent_id":"a","ip":"198.18.0.1","colour":"red"}`, 400, api.CodeBadRequest, `"colour"`},
		{"missing agent_id", "POST", "/overlay-master/agents", `{"ip":"198.18.0.1"}`, 400, api.CodeBadRequest, "agent_id"},
		{"invalid IP", "POST", "/overlay-master/agents", `{"agent_id":"a","ip":"198.18.0.256"}`, 400, api.CodeBadRequest, "ip"},
		{"wrong type", "POST", "/overlay-master/agents", `{"agent_id":7,"ip":"198.18.0.1"}`, 400, api.CodeBadRequest, "agent_id"},
		{"oversized body", "POST", "/overlay-master/agents", huge, 413, api.CodeTooLarge, "larger than"},
		{"trailing garbage", "POST", "/overlay-master/agents", `{"agent_id":"a","ip":"198.18.0.1"} x`, 400, api.CodeBadRequest, "after the JSON"},
		{"unknown agent", "GET", "/overlay-master/agents/nobody", ``, 404, api.CodeNotFound, "nobody"},
		{"delete unknown agent", "DELETE", "/overlay-master/agents/nobody", ``, 404, api.CodeNotFound, "nobody"},
		{"bulk delete empty", "POST", "/overlay-master/agents/delete", `{"agents":[]}`, 400, api.CodeBadRequest, "agents"},
		{"bulk delete bad field", "POST", "/overlay-master/agents/delete", `{"agent":["a"]}`, 400, api.CodeBadRequest, `"agent"`},
		{"state bad param", "GET", "/overlay-master/state?foo=1", ``, 400, api.CodeBadRequest, "foo"},
		{"state bad index", "GET", "/overlay-master/state?index=-1", ``, 400, api.CodeBadRequest, "index"},
		{"state bad wait", "GET", "/overlay-master/state?index=1&wait=forever", ``, 400, api.CodeBadRequest, "wait"},
		{"state bad consistent", "GET", "/overlay-master/state?consistent=maybe", ``, 400, api.CodeBadRequest, "consistent"},
		{"join without id", "POST", "/cluster/join", `{"raft_addr":"127.0.0.1:1"}`, 400, api.CodeBadRequest, "id"},
		{"join bad addr", "POST", "/cluster/join", `{"id":"m9","raft_addr":"nowhere"}`, 400, api.CodeBadRequest, "raft_addr"},
		{"join wildcard raft addr", "POST", "/cluster/join", `{"id":"m9","raft_addr":"0.0.0.0:8300"}`, 400, api.CodeBadRequest, "wildcard"},
		{"join wildcard http addr", "POST", "/cluster/join", `{"id":"m9","raft_addr":"127.0.0.1:1","http_addr":"[::]:8080"}`, 400, api.CodeBadRequest, "http_addr"},
		{"wrong method", "PUT", "/overlay-master/agents", `{}`, 405, api.CodeBadRequest, "PUT"},
		{"no such endpoint", "GET", "/overlay-master/nothing", ``, 404, api.CodeNotFound, "nothing"},
	}
	for _, target := range []int{leader, follower} {
		for _, tt := range tests {
			t.Run(fmt.Sprintf("%s/%s", map[bool]string{true: "leader", false: "follower"}[target == leader], tt.name), func(t *testing.T) {
				status, hdr, data := httpCall(t, tt.method, "http://"+c.httpAddrs[target]+tt.path, "application/json", strings.NewReader(tt.body))
				if status != tt.status {
					t.Errorf("status %d, want %d: %s", status, tt.status, data)
				}
				if ct := hdr.Get("Content-Type"); ct != "application/json" {
					t.Errorf("content type %q", ct)
				}
				var e api.Error
				if err := json.Unmarshal(data, &e); err != nil || e.Code != tt.code || !strings.Contains(e.Message, tt.mention) {
					t.Errorf("body %s: want code %q and a message naming %q", data, tt.code, tt.mention)
				}
			})
		}
	}
	after := c.waitConverged()
	if !bytes.Equal(before, after) {
		t.Errorf("bad input changed the state:\n%s\n%s", before, after)
	}
}

func TestFollowerProxyWatchAndStatus(t *testing.T) {
	t.Parallel() // its own masters: loopback ports, data dirs; it mostly waits on Raft
	if testing.Short() {
		t.Skip("cluster test")
	}
	forEachSecurity(t, testFollowerProxyWatchAndStatus)
}

func testFollowerProxyWatchAndStatus(t *testing.T, p *testPKI) {
	c := newTestClusterWith(t, 3, netconfig.Default(), p)
	leader := c.waitLeader()
	follower := (leader + 1) % 3
	c.waitConverged()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	onlyFollower := c.onlyClient(follower)
	st0, err := onlyFollower.State(ctx, apiclient.StateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st0.Leader != c.ids[leader] {
		t.Errorf("state names leader %q, want %q", st0.Leader, c.ids[leader])
	}

	// A blocking watch on the follower wakes up when a registration commits.
	type watchResult struct {
		st  *api.State
		err error
	}
	woke := make(chan watchResult, 1)
	go func() {
		st, err := onlyFollower.State(ctx, apiclient.StateOptions{Index: st0.Index, Wait: 30 * time.Second})
		woke <- watchResult{st, err}
	}()
	// The write goes to the follower, which proxies it to the leader.
	info, err := onlyFollower.Register(ctx, api.RegisterRequest{AgentID: "via-follower", IP: "198.18.0.5"})
	if err != nil {
		t.Fatalf("register through follower: %v", err)
	}
	// The watch answers with the state that holds the write (nothing else
	// changed the state meanwhile).
	r := <-woke
	if r.err != nil || r.st.Index != info.Version || len(r.st.Agents) != 1 || r.st.Agents[0].AgentID != "via-follower" {
		t.Fatalf("watch: %+v %v, want the state at index %d with via-follower", r.st, r.err, info.Version)
	}
	// Linearizable read through the follower sees the write at once.
	st, err := onlyFollower.State(ctx, apiclient.StateOptions{Consistent: true})
	if err != nil || len(st.Agents) != 1 || st.Agents[0].Version != info.Version {
		t.Fatalf("consistent read: %+v %v", st, err)
	}
	// A watch that times out answers with the unchanged state.
	start := time.Now()
	st2, err := onlyFollower.State(ctx, apiclient.StateOptions{Index: st.Index + 1000, Wait: 300 * time.Millisecond})
	if err != nil || st2.Index != st.Index || time.Since(start) < 300*time.Millisecond {
		t.Errorf("timed out watch: %+v %v after %s", st2, err, time.Since(start))
	}
	// /cluster/status on a follower names the leader and its HTTP address
	// (the leader of now: a loaded machine may have elected again).
	var cs *api.ClusterStatus
	testutil.Eventually(t, 0, "the follower's cluster status names the leader", func() error {
		cur := c.waitLeader()
		var err error
		if cs, err = onlyFollower.ClusterStatus(ctx); err != nil {
			return err
		}
		if cur == follower {
			t.Logf("the follower %s was elected meanwhile: its status names itself", c.ids[follower])
			return nil
		}
		if cs.Role != "follower" || cs.Leader == nil || cs.Leader.ID != c.ids[cur] || cs.Leader.HTTPAddr != c.httpAddrs[cur] ||
			cs.Leader.URL != c.urls()[cur] || len(cs.Servers) != 3 {
			return fmt.Errorf("cluster status %+v leader %+v, want leader %s", cs, cs.Leader, c.ids[cur])
		}
		return nil
	})
	if cs.ClusterID == "" || cs.ClusterID != st.ClusterID || !cs.CaughtUp {
		t.Errorf("cluster status: cluster_id %q caught_up %v, state cluster_id %q", cs.ClusterID, cs.CaughtUp, st.ClusterID)
	}
	// Delete through the follower, then its agent record is gone everywhere.
	if err := callRetrying(ctx, func() error { return onlyFollower.DeleteAgent(ctx, "via-follower") }); err != nil {
		t.Fatal(err)
	}
	if err := callRetrying(ctx, func() error { return onlyFollower.DeleteAgent(ctx, "via-follower") }); err != nil {
		t.Errorf("second delete should be idempotent: %v", err)
	}
	if _, err := onlyFollower.Agent(ctx, "via-follower"); !api.IsCode(err, api.CodeNotFound) {
		t.Errorf("deleted agent: %v", err)
	}
	// metrics are served
	hc := http.DefaultClient
	if p != nil {
		hc = p.httpClient("", "") // /metrics is open: no certificate
	}
	status, data := secureCall(t, hc, "GET", c.urls()[leader]+"/metrics", "", nil)
	for _, want := range []string{"carve_master_registrations_total", "carve_master_allocation_failures_total", "carve_master_agents"} {
		if status != 200 || !bytes.Contains(data, []byte(want)) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func TestNoLeaderAnswers503(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	c := &testCluster{t: t, cfg: netconfig.Default(), masters: make([]*Master, 3)}
	for i := range 3 {
		c.addSlot(fmt.Sprintf("m%d", i+1))
	}
	t.Cleanup(func() { c.stop(0) })
	c.start(0) // alone: no quorum, no leader
	status, hdr, data := httpCall(t, "POST", "http://"+c.httpAddrs[0]+"/overlay-master/agents", "application/json",
		strings.NewReader(`{"agent_id":"a","ip":"198.18.0.1"}`))
	var e api.Error
	_ = json.Unmarshal(data, &e)
	if status != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" || e.Code != api.CodeNoLeader {
		t.Errorf("status %d Retry-After %q body %s", status, hdr.Get("Retry-After"), data)
	}
	// Reads too: this master has never caught up with a leader, so its
	// (empty) table is not the cluster's.
	status, hdr, data = httpCall(t, "GET", "http://"+c.httpAddrs[0]+"/overlay-master/state", "", nil)
	e = api.Error{}
	_ = json.Unmarshal(data, &e)
	if status != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" || e.Code != api.CodeNoLeader {
		t.Errorf("state without leader: status %d Retry-After %q body %s", status, hdr.Get("Retry-After"), data)
	}
}

func TestJoinAndRemoveMaster(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	forEachSecurity(t, testJoinAndRemoveMaster)
}

func testJoinAndRemoveMaster(t *testing.T, p *testPKI) {
	c := newTestClusterWith(t, 3, netconfig.Default(), p)
	leader := c.waitLeader()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := c.client(leader)
	for i := range 10 {
		if _, err := registerRetrying(ctx, cl, api.RegisterRequest{AgentID: fmt.Sprintf("a%d", i), IP: fmt.Sprintf("198.18.0.%d", i+1)}); err != nil {
			t.Fatal(err)
		}
	}
	// A fourth master joins through a follower.
	c.addSlot("m4")
	opts := c.options(3)
	opts.Join = c.urls()[(leader+1)%3]
	c.startWith(3, opts)
	want := c.waitConverged()
	testutil.Eventually(t, 0, "m4 to see 4 servers", testutil.True(func() bool { return len(c.masters[3].node.Status().Servers) == 4 }))
	if n := len(c.masters[leader].node.Status().Servers); n != 4 {
		t.Fatalf("after join the leader sees %d servers", n)
	}
	got, _, _ := c.masters[3].table.StateJSON("")
	if !bytes.Equal(got, want) {
		t.Fatalf("joined master has a different state")
	}
	// Joining again is idempotent.
	if err := cl.Join(ctx, api.JoinRequest{ID: "m4", RaftAddr: c.raftAddrs[3], HTTPAddr: c.httpAddrs[3]}); err != nil {
		t.Errorf("second join: %v", err)
	}
	// Remove it (twice: idempotent).
	for range 2 {
		if err := cl.RemoveServer(ctx, "m4"); err != nil {
			t.Fatalf("remove: %v", err)
		}
	}
	cs, err := cl.ClusterStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs.Servers) != 3 {
		t.Errorf("after removal %d servers: %+v", len(cs.Servers), cs.Servers)
	}
	// A master the cluster never knew (a typo) is a 404 naming the
	// servers, not a removal of nothing (issue 20, finding 7).
	var e *api.Error
	if err := cl.RemoveServer(ctx, "m5"); !errors.As(err, &e) || e.Status != http.StatusNotFound || !strings.Contains(e.Message, "m1, m2, m3") {
		t.Errorf("remove of the unknown m5: %v, want a 404 naming m1, m2, m3", err)
	}
}

// TestConfigHasOneAuthority (issue 27, item 1): the committed network
// configuration is the cluster's one authority. Masters restarted with
// another file (one of them with none at all: the built-in defaults) and
// elected leader change nothing, and say that their file differs; only an
// operator's PUT /cluster/config changes it, merged as always (a dropped
// overlay with leases is kept, disabled).
func TestConfigHasOneAuthority(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	two := netconfig.WithDefaults(api.NetworkConfig{Overlays: []api.OverlayNetwork{api.OverlayNetwork{Name: "one", Subnet: "10.1.0.0/16", Prefix: 24},
		api.OverlayNetwork{Name: "two", Subnet: "10.2.0.0/16", Prefix: 24}}})
	c := newTestCluster(t, 3, two)
	leader := c.waitLeader()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := registerRetrying(ctx, c.client(leader), api.RegisterRequest{AgentID: "a1", IP: "198.18.0.1"}); err != nil {
		t.Fatal(err)
	}
	three := netconfig.WithDefaults(api.NetworkConfig{Overlays: []api.OverlayNetwork{api.OverlayNetwork{Name: "one", Subnet: "10.1.0.0/16", Prefix: 24},
		api.OverlayNetwork{Name: "three", Subnet: "10.3.0.0/16", Prefix: 24}}})
	// Every master restarts with another file; the last with none.
	c.cfg = three
	for i := range c.masters {
		c.stop(i)
	}
	for i := range c.masters {
		if i == len(c.masters)-1 {
			c.cfg = netconfig.Default()
		}
		c.start(i)
	}
	leader = c.waitLeader()
	// Every master, whichever leads, serves the committed configuration.
	for i := range c.masters {
		testutil.Eventually(t, 0, "a master serves the committed configuration", func() error {
			ans, err := c.client(i).Config(ctx)
			if err != nil {
				return err
			}
			if names := overlayNames(ans.Config); names != "one,two" {
				return fmt.Errorf("master %d serves overlays %s, want one,two (the committed ones)", i, names)
			}
			return nil
		})
		st, err := c.client(i).ClusterStatus(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(st.ConfigDiffers, "carve config apply") {
			t.Errorf("master %d: config_differs %q, want it to say the file differs and how to apply it", i, st.ConfigDiffers)
		}
	}
	if a, err := c.client(leader).Agent(ctx, "a1"); err != nil || a.Overlay("three") != nil || a.Overlay("two") == nil || !a.Overlay("two").Info.IsEnabled() {
		t.Fatalf("an election changed a1's overlays: %+v %v", a, err)
	}
	// A dry run says what would change and commits nothing.
	dry, err := c.client(leader).ApplyConfig(ctx, three, true)
	if err != nil || !dry.Changed || !dry.DryRun || overlayNames(dry.Config) != "one,two" {
		t.Fatalf("dry run: %+v %v", dry, err)
	}
	// The operator's act changes it.
	ans, err := c.client(leader).ApplyConfig(ctx, three, false)
	if err != nil || !ans.Changed || overlayNames(ans.Config) != "one,three,two" {
		t.Fatalf("apply: %+v %v, want overlays one,three,two (two kept: it holds leases)", ans, err)
	}
	var a *api.AgentInfo
	testutil.Eventually(t, 0, "the applied config to reach a1's record", func() error {
		var err error
		if a, err = c.client(leader).Agent(ctx, "a1"); err != nil {
			return err
		}
		if a.Overlay("three") == nil {
			return fmt.Errorf("a1 has no overlay three yet: %+v", a.Overlays)
		}
		return nil
	})
	// Kept disabled: the lease stays in the record, "enabled": false, so
	// that the agent drains it (issue 20, finding 4).
	if two := a.Overlay("two"); two == nil || two.Info.IsEnabled() || two.Subnet != "10.2.0.0/24" || len(a.NotLeased) != 0 {
		t.Fatalf("dropped overlay should be kept disabled (in the record with its lease, enabled: false): %+v, not leased %+v", two, a.NotLeased)
	}
	if a.Overlay("three").Subnet != "10.3.0.0/24" {
		t.Fatalf("added overlay: %+v", a.Overlay("three"))
	}
	if again, err := c.client(leader).ApplyConfig(ctx, three, false); err != nil || again.Changed {
		t.Errorf("applying the same file again: %+v %v, want no change", again, err)
	}
	// A bad configuration is refused whole, naming the field.
	var e *api.Error
	if _, err := c.client(leader).ApplyConfig(ctx, api.NetworkConfig{VTEPSubnet: "bad"}, false); !errors.As(err, &e) || e.Status != http.StatusBadRequest || !strings.Contains(e.Message, "vtep_subnet") {
		t.Errorf("a bad configuration: %v, want 400 naming vtep_subnet", err)
	}
}

// overlayNames lists a configuration's overlays, sorted, comma separated.
func overlayNames(cfg api.NetworkConfig) string {
	var names []string
	for _, o := range cfg.Overlays {
		names = append(names, o.Name)
	}
	slices.Sort(names)
	return strings.Join(names, ",")
}
