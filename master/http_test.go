package master

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/logcmd"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/raftlog"
)

// A bulk delete that reuses a registration's request_id is refused with 409
// and deletes nothing.
func TestHTTPRequestIDReuseConflict(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	c := newTestCluster(t, 1, netconfig.Default())
	c.waitLeader()
	base := "http://" + c.httpAddrs[0]
	status, _, data := httpCall(t, "POST", base+"/overlay-master/agents", "application/json",
		strings.NewReader(`{"agent_id":"a1","ip":"198.18.0.1","request_id":"same"}`))
	if status != http.StatusOK {
		t.Fatalf("register: %d %s", status, data)
	}
	status, _, data = httpCall(t, "POST", base+"/overlay-master/agents/delete", "application/json",
		strings.NewReader(`{"agents":["a1"],"request_id":"same"}`))
	var e api.Error
	_ = json.Unmarshal(data, &e)
	if status != http.StatusConflict || e.Code != api.CodeConflict || !strings.Contains(e.Message, "request_id") {
		t.Errorf("delete reusing a registration's request_id: %d %s; want 409 %q naming request_id", status, data, api.CodeConflict)
	}
	if status, _, data := httpCall(t, "GET", base+"/overlay-master/agents/a1", "", nil); status != http.StatusOK {
		t.Errorf("a1 after the refused delete: %d %s", status, data)
	}
}

// Every answer to a registration carries an index to wait for, also when it
// changed nothing, and the follower that proxied it has applied that index.
func TestUnchangedRegistrationCarriesIndex(t *testing.T) {
	t.Parallel() // its own masters: loopback ports, data dirs; it mostly waits on Raft
	if testing.Short() {
		t.Skip("cluster test")
	}
	c := newTestCluster(t, 3, netconfig.Default())
	leader := c.waitLeader()
	follower := (leader + 1) % 3
	body := `{"agent_id":"a1","ip":"198.18.0.1","hostname":"h1"}`
	status, hdr, data := httpCall(t, "POST", "http://"+c.httpAddrs[leader]+"/overlay-master/agents", "application/json", strings.NewReader(body))
	if status != http.StatusOK || hdr.Get(indexHeader) == "" {
		t.Fatalf("first registration: %d %s index %q", status, data, hdr.Get(indexHeader))
	}
	var first api.AgentInfo
	if err := json.Unmarshal(data, &first); err != nil {
		t.Fatal(err)
	}
	for _, target := range []int{leader, follower} {
		status, hdr, data := httpCall(t, "POST", "http://"+c.httpAddrs[target]+"/overlay-master/agents", "application/json", strings.NewReader(body))
		if status != http.StatusOK {
			t.Fatalf("%s: unchanged registration: %d %s", c.ids[target], status, data)
		}
		idx, err := strconv.ParseUint(hdr.Get(indexHeader), 10, 64)
		if err != nil || idx < first.Version {
			t.Errorf("%s: unchanged registration answered %s %q, want an index >= the record's version %d", c.ids[target], indexHeader, hdr.Get(indexHeader), first.Version)
			continue
		}
		if applied := c.masters[target].node.AppliedIndex(); target == follower && applied < first.Version {
			t.Errorf("the follower answered before applying the record (applied %d < %d)", applied, first.Version)
		}
	}
}

// The state index header and the body describe the same state, however fast
// the state changes.
func TestStateIndexHeaderMatchesBody(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	c := newTestCluster(t, 1, netconfig.Default())
	c.waitLeader()
	m := c.masters[0]
	// Changes are applied straight to the table, as raft's FSM goroutine
	// does, so that they come faster than reads can be answered.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		index := m.table.AppliedIndex() + 1000
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			cmd, err := logcmd.RegisterCommand(api.RegisterRequest{AgentID: "a1", IP: "198.18.0.1", Hostname: fmt.Sprint("h", i)})
			if err != nil {
				panic(err)
			}
			data, err := cmd.Encode()
			if err != nil {
				panic(err)
			}
			index++
			m.table.Apply(index, data)
		}
	}()
	defer func() { close(stop); <-done }()
	mismatches := 0
	for range 400 {
		status, hdr, data := httpCall(t, "GET", "http://"+c.httpAddrs[0]+"/overlay-master/state", "", nil)
		if status != http.StatusOK {
			t.Fatalf("state: %d %s", status, data)
		}
		var st api.State
		if err := json.Unmarshal(data, &st); err != nil {
			t.Fatal(err)
		}
		if h := hdr.Get("X-Carve-State-Index"); h != strconv.FormatUint(st.Index, 10) {
			mismatches++
			if mismatches == 1 {
				t.Errorf("X-Carve-State-Index %s, body index %d", h, st.Index)
			}
		}
	}
	if mismatches > 0 {
		t.Errorf("%d of 400 answers had a header index other than the body's", mismatches)
	}
}

// A wildcard HTTP address cannot be published as the leader's: followers
// would forward writes to themselves.
func TestWildcardHTTPAddrRefused(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", "[::]:0", ":0"} {
		t.Run(addr, func(t *testing.T) {
			raftAddr := freeAddr(t)
			m, err := Start(context.Background(), Options{
				ID: "m1", DataDir: t.TempDir(), HTTPAddr: addr, RaftAddr: raftAddr,
				Peers:   []raftlog.Server{{ID: "m1", Address: raftAddr, Voter: true}},
				Network: netconfig.Default(), Logger: testLogger(t), Insecure: true,
			})
			if err == nil {
				m.Close()
				t.Fatalf("Start with --http-addr %s succeeded", addr)
			}
			if !strings.Contains(err.Error(), "--http-addr") || !strings.Contains(err.Error(), "wildcard") {
				t.Errorf("error %q should name --http-addr and say the wildcard is the problem", err)
			}
		})
	}
}

// Requests are counted under their route's template, so that dashboards
// can tell state reads from registrations.
func TestHTTPRequestsCountedByRoute(t *testing.T) {
	t.Parallel() // its own masters: loopback ports, data dirs; it mostly waits on Raft
	if testing.Short() {
		t.Skip("cluster test")
	}
	c := newTestCluster(t, 1, netconfig.Default())
	c.waitLeader()
	base := "http://" + c.httpAddrs[0]
	for _, path := range []string{"/overlay-master/state", "/overlay-master/agents/nobody", "/cluster/status", "/nothing"} {
		httpCall(t, "GET", base+path, "", nil)
	}
	mfs, err := c.masters[0].registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, mf := range mfs {
		if mf.GetName() != "carve_master_http_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			got[labels["method"]+" "+labels["route"]+" "+labels["code"]] = true
		}
	}
	for _, want := range []string{"GET /overlay-master/state 200", "GET /overlay-master/agents/{id} 404", "GET /cluster/status 200", "GET other 404"} {
		if !got[want] {
			t.Errorf("no carve_master_http_requests_total series %q; have %v", want, got)
		}
	}
}
