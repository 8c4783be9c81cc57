package master

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/dcosproto"
	"github.com/carve-net/carve/test/lab/testutil"
)

// dcosDefaultConfig is DC/OS's default overlay network configuration,
// verbatim (state/testdata/dcos-default-network.json), parsed as a master does.
func dcosDefaultConfig(t *testing.T) api.NetworkConfig {
	t.Helper()
	cfg, err := netconfig.Load("state/testdata/dcos-default-network.json")
	if err != nil {
		t.Fatalf("DC/OS's default configuration refused: %v", err)
	}
	return cfg
}

// TestDCOSDefaultConfigLeases: DC/OS's default configuration, loaded into a
// real 3-master cluster, leases what DC/OS leases: a /24 of 9.0.0.0/8, a
// /80 of the IPv6-only dcos6, a VTEP IP of 44.128.0.0/20 and an IPv6 VTEP
// address of fd01:a::/64 with its prefix; a deleted agent's vtep_ip6 is
// reused first fit; vtep_port 64000 when configured.
func TestDCOSDefaultConfigLeases(t *testing.T) {
	t.Parallel() // its own masters: loopback ports, data dirs; it mostly waits on Raft
	cfg := dcosDefaultConfig(t)
	cfg.VTEPPort = 64000 // dcos-net's port, as a configuration sets it
	c := newTestCluster(t, 3, cfg)
	c.waitLeader()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := c.client(1)
	reg := func(id, ip string) *api.AgentInfo {
		t.Helper()
		a, err := registerRetrying(ctx, cl, api.RegisterRequest{AgentID: id, IP: ip, NetworkConfig: api.AgentNetworkConfig{MesosBridge: true, DockerBridge: true}})
		if err != nil {
			t.Fatalf("register %s: %v", id, err)
		}
		return a
	}
	a1, a2 := reg("a1", "198.18.0.1"), reg("a2", "198.18.0.2")
	for _, tt := range []struct {
		a                                 *api.AgentInfo
		subnet, subnet6, vtep, vtep6, mac string
		mesos6                            string
	}{
		{a1, "9.0.0.0/24", "fd01:b::/80", "44.128.0.1/20", "fd01:a::1/64", "70:b3:d5:80:00:01", "fd01:b::/81"},
		{a2, "9.0.1.0/24", "fd01:b:0:0:1::/80", "44.128.0.2/20", "fd01:a::2/64", "70:b3:d5:80:00:02", "fd01:b:0:0:1::/81"},
	} {
		d, d6 := tt.a.Overlay("dcos"), tt.a.Overlay("dcos6")
		if d == nil || d6 == nil {
			t.Fatalf("%s: overlays %+v", tt.a.AgentID, tt.a.Overlays)
		}
		vx := d6.Backend.VXLAN
		got := fmt.Sprint(d.Subnet, " ", d6.Subnet6, " ", d6.Subnet, " ", vx.VTEPIP, " ", vx.VTEPIP6, " ", vx.VTEPMAC, " ", vx.VTEPPort, " ", d6.MesosBridge.IP6)
		want := fmt.Sprint(tt.subnet, " ", tt.subnet6, " ", "", " ", tt.vtep, " ", tt.vtep6, " ", tt.mac, " ", 64000, " ", tt.mesos6)
		if got != want {
			t.Errorf("%s: got  %s\nwant %s", tt.a.AgentID, got, want)
		}
	}
	if err := cl.DeleteAgent(ctx, "a1"); err != nil {
		t.Fatal(err)
	}
	if a3 := reg("a3", "198.18.0.3"); a3.Overlay("dcos").Backend.VXLAN.VTEPIP6 != "fd01:a::1/64" {
		t.Errorf("a deleted agent's vtep_ip6 not reused first fit: %+v", a3.Overlay("dcos").Backend.VXLAN)
	}
	state := c.waitConverged()
	if !strings.Contains(string(state), `"vtep_subnet6":"fd01:a::/64"`) || !strings.Contains(string(state), `"name":"dcos6","subnet6":"fd01:b::/64","prefix6":80,"enabled":true`) {
		t.Errorf("the state does not echo DC/OS's configuration with enabled written:\n%s", state)
	}
}

// get reads a raw answer with the operator's (or no) certificate.
func (c *testCluster) get(t *testing.T, i int, path string) []byte {
	t.Helper()
	hc := &http.Client{Timeout: 20 * time.Second}
	if c.pki != nil {
		hc = c.pki.httpClient("operator", pki.RoleOperator)
	}
	code, body := secureCall(t, hc, http.MethodGet, c.urls()[i]+path, "", nil)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, code, body)
	}
	return body
}

// TestLiveStateDecodesWithDCOSSchema decodes the live state and agent
// records of a secure 3-master cluster with DC/OS's messages (unknown keys
// ignored): agents registered, one overlay out of space for the last
// agent, one disabled, DC/OS's IPv6-only dcos6, an agent that reported its
// configuration (OK for one overlay, FAILED for another) and one whose IP
// was taken over. Required fields are present, statuses within DC/OS's
// enum, and every field DC/OS consumers read is checked.
func TestLiveStateDecodesWithDCOSSchema(t *testing.T) {
	t.Parallel() // its own masters: loopback ports, data dirs; it mostly waits on Raft
	cfg := dcosDefaultConfig(t)
	cfg.Overlays = append(cfg.Overlays,
		api.OverlayNetwork{Name: "small", Subnet: "10.1.0.0/28", Prefix: 29}, // two agents' worth
		api.OverlayNetwork{Name: "off", Subnet: "10.2.0.0/16", Prefix: 24, Enabled: new(bool)})
	c := newTestClusterWith(t, 3, cfg, newTestPKI(t))
	c.waitLeader()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i, id := range []string{"a1", "a2", "a3", "a4"} {
		ip := fmt.Sprintf("198.18.0.%d", i+1)
		if id == "a4" {
			ip = "198.18.0.1" // takes a1's IP
		}
		c.pki.IssueAgent(id, netip.MustParseAddr(ip))
		if _, err := registerRetrying(ctx, c.clientAs(i, id, pki.RoleAgent), api.RegisterRequest{AgentID: id, IP: ip,
			NetworkConfig: api.AgentNetworkConfig{MesosBridge: true, DockerBridge: i%2 == 0}}); err != nil {
			t.Fatalf("register %s: %v", id, err)
		}
	}
	a2 := c.clientAs(2, "a2", pki.RoleAgent) // through a follower or the leader alike
	rec, err := a2.Agent(ctx, "a2")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a2.Report(ctx, "a2", api.ReportRequest{Version: rec.Version, ConfigurationAttempts: 3, Overlays: []api.OverlayReport{
		{Name: "dcos", Status: api.StatusOK}, {Name: "dcos6", Status: api.StatusFailed, Error: "address fd01:b:0:0:1::1/81 on m-dcos6: permission denied"},
	}}); err != nil {
		t.Fatalf("report: %v", err)
	}
	c.waitConverged()
	for i := range 3 {
		raw := c.get(t, i, "/overlay-master/state")
		st, err := dcosproto.Decode("State", raw)
		if err != nil {
			t.Fatalf("master %d: the live state does not decode with DC/OS's schema: %v\n%s", i, err, raw)
		}
		if err := dcosproto.CheckState(st); err != nil {
			t.Fatalf("master %d: %v\n%s", i, err, raw)
		}
	}
	records := map[string]*api.AgentInfo{}
	for _, id := range []string{"a1", "a2", "a3", "a4"} {
		raw := c.get(t, 1, "/overlay-master/agents/"+id)
		msg, err := dcosproto.Decode("AgentInfo", raw)
		if err == nil {
			err = dcosproto.CheckAgent(msg)
		}
		if err != nil {
			t.Fatalf("agent %s: %v\n%s", id, err, raw)
		}
		var info api.AgentInfo
		if err := json.Unmarshal(raw, &info); err != nil {
			t.Fatal(err)
		}
		records[id] = &info
		wantDCOS, wantDCOS6 := api.StatusConfiguring, api.StatusConfiguring
		if id == "a2" {
			wantDCOS, wantDCOS6 = api.StatusOK, api.StatusFailed
		}
		if s, _ := dcosproto.Status(msg, "dcos"); s != wantDCOS {
			t.Errorf("%s dcos: status %s, want %s", id, s, wantDCOS)
		}
		if s, e := dcosproto.Status(msg, "dcos6"); s != wantDCOS6 || (id == "a2" && !strings.Contains(e, "permission denied")) {
			t.Errorf("%s dcos6: status %s %q, want %s", id, s, e, wantDCOS6)
		}
	}
	if a := records["a2"]; a.ConfigurationAttempts != 3 {
		t.Errorf("a2 configuration_attempts %d, want 3", a.ConfigurationAttempts)
	}
	if a := records["a1"]; a.IP != api.NoIP {
		t.Errorf("a1, whose IP a4 took, has ip %q, want %s", a.IP, api.NoIP)
	}
	if a := records["a3"]; a.Overlay("small") != nil || !notLeased(a, "small", "exhausted") || !notLeased(a, "off", "disabled") {
		t.Errorf("a3: small should be left out as exhausted, off as disabled: overlays %+v not leased %+v", a.Overlays, a.NotLeased)
	}
	for id, a := range records {
		if a.Overlay("off") != nil {
			t.Errorf("%s holds the disabled overlay in its record", id)
		}
	}
}

func notLeased(a *api.AgentInfo, name, reason string) bool {
	for _, nl := range a.NotLeased {
		if nl.Name == name && strings.Contains(nl.Reason, reason) {
			return true
		}
	}
	return false
}

// TestAgentReports: a report is committed once (a repeat is answered
// without a log entry), moves the state index but never the record's
// version (peers do not churn on reports), survives a leader change and
// a restart from snapshots, and is shown only for the record version it
// covers. An agent reports only for itself.
func TestAgentReports(t *testing.T) {
	t.Parallel() // its own masters: loopback ports, data dirs; it mostly waits on Raft
	p := newTestPKI(t)
	c := newTestClusterWith(t, 3, netconfig.Default(), p)
	leader := c.waitLeader()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p.IssueAgent("a1", netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.0.11")) // it moves below
	self := c.clientAs(leader+1, "a1", pki.RoleAgent)
	rec, err := registerRetrying(ctx, self, api.RegisterRequest{AgentID: "a1", IP: "198.18.0.1", NetworkConfig: api.AgentNetworkConfig{MesosBridge: true}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := registerRetrying(ctx, c.client(0), api.RegisterRequest{AgentID: "a2", IP: "198.18.0.2"}); err != nil {
		t.Fatal(err)
	}
	before, err := c.client(0).State(ctx, apiclient.StateOptions{Consistent: true})
	if err != nil {
		t.Fatal(err)
	}
	report := api.ReportRequest{Version: rec.Version, ConfigurationAttempts: 1, Overlays: []api.OverlayReport{{Name: "carve", Status: api.StatusOK}}}
	got, err := self.Report(ctx, "a1", report)
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != rec.Version || got.Overlay("carve").State.Status != api.StatusOK || got.ConfigurationAttempts != 1 {
		t.Fatalf("after the report: version %d (was %d), %+v", got.Version, rec.Version, got.Overlay("carve").State)
	}
	after, err := c.client(0).State(ctx, apiclient.StateOptions{Consistent: true})
	if err != nil {
		t.Fatal(err)
	}
	if after.Index <= before.Index {
		t.Errorf("a report did not move the state index (%d -> %d)", before.Index, after.Index)
	}
	applied := c.masters[leader].node.Status().LastIndex
	if _, err := self.Report(ctx, "a1", report); err != nil {
		t.Fatal(err)
	}
	if again := c.masters[leader].node.Status().LastIndex; again != applied {
		t.Errorf("an unchanged report wrote the log (%d -> %d)", applied, again)
	}
	// Another agent's certificate may not report for a1.
	_, err = c.clientAs(0, "a2", pki.RoleAgent).Report(ctx, "a1", report)
	if !api.IsCode(err, api.CodeForbidden) {
		t.Errorf("a2 reporting for a1: %v, want %s", err, api.CodeForbidden)
	}
	for _, bad := range []api.ReportRequest{
		{Version: rec.Version + 1000, Overlays: report.Overlays},
		{Version: rec.Version, Overlays: []api.OverlayReport{{Name: "carve", Status: "STATUS_DISABLED"}}},
		{Version: rec.Version, Overlays: []api.OverlayReport{{Name: "carve", Status: api.StatusOK}, {Name: "carve", Status: api.StatusOK}}},
	} {
		if _, err := self.Report(ctx, "a1", bad); err == nil {
			t.Errorf("report %+v accepted", bad)
		}
	}
	// A new version of the record shows CONFIGURING until reported again.
	moved, err := registerRetrying(ctx, self, api.RegisterRequest{AgentID: "a1", IP: "198.18.0.11", NetworkConfig: api.AgentNetworkConfig{MesosBridge: true}})
	if err != nil {
		t.Fatal(err)
	}
	if s := moved.Overlay("carve").State.Status; s != api.StatusConfiguring || moved.ConfigurationAttempts != 1 {
		t.Errorf("a new record version shows %s (attempts %d), want %s until reported", s, moved.ConfigurationAttempts, api.StatusConfiguring)
	}
	report.Version, report.ConfigurationAttempts = moved.Version, 2
	report.Overlays[0] = api.OverlayReport{Name: "carve", Status: api.StatusFailed, Error: "bridge m-carve: file exists"}
	if _, err := self.Report(ctx, "a1", report); err != nil {
		t.Fatal(err)
	}
	// Through a restart of every master (log replay; snapshots are
	// TestSnapshotKeepsReportsAndVTEP6's).
	for i := range c.masters {
		c.stop(i)
	}
	for i := range c.masters {
		c.start(i)
	}
	c.waitLeader()
	var back *api.AgentInfo
	testutil.Eventually(t, 0, "a1's record after the restart", func() error {
		var err error
		back, err = c.client(0).Agent(ctx, "a1")
		return err
	})
	if st := back.Overlay("carve").State; st.Status != api.StatusFailed || st.Error != "bridge m-carve: file exists" || back.ConfigurationAttempts != 2 || back.Version != moved.Version {
		t.Errorf("after a restart: %+v attempts %d version %d", st, back.ConfigurationAttempts, back.Version)
	}
}
