package master

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/master/state"
)

// TestVersionsAreVisible (issue 20, finding 3): /cluster/status shows the
// master's build and counts the agents by the carve version they
// registered with (an agent of an earlier version sends none); the record
// keeps the version, and an upgraded agent's registration updates it; the
// metrics carry carve_build_info.
func TestVersionsAreVisible(t *testing.T) {
	t.Parallel() // its own masters: loopback ports, data dirs; it mostly waits on Raft
	if testing.Short() {
		t.Skip("cluster test")
	}
	c := newTestCluster(t, 1, netconfig.Default())
	c.waitLeader()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := c.client(0)
	for _, req := range []api.RegisterRequest{
		{AgentID: "a1", IP: "198.18.0.1", CarveVersion: "v0.3.0"},
		{AgentID: "a2", IP: "198.18.0.2", CarveVersion: "v0.2.0"},
		{AgentID: "a3", IP: "198.18.0.3"},
		{AgentID: "a2", IP: "198.18.0.2", CarveVersion: "v0.3.0"}, // upgraded
	} {
		if _, err := registerRetrying(ctx, cl, req); err != nil {
			t.Fatal(err)
		}
	}
	st, err := cl.ClusterStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Build == nil || st.Build.Version == "" || st.Build.GoVersion == "" {
		t.Errorf("build: %+v", st.Build)
	}
	if len(st.AgentVersions) != 2 || st.AgentVersions["v0.3.0"] != 2 || st.AgentVersions[state.UnknownVersion] != 1 {
		t.Errorf("agent versions %v, want v0.3.0: 2, unknown: 1", st.AgentVersions)
	}
	a2, err := cl.Agent(ctx, "a2")
	if err != nil || a2.CarveVersion != "v0.3.0" {
		t.Errorf("a2's record: %+v, %v; want carve_version v0.3.0", a2, err)
	}
	_, _, data := httpCall(t, http.MethodGet, "http://"+c.httpAddrs[0]+"/metrics", "", nil)
	if !strings.Contains(string(data), "carve_build_info{") {
		t.Errorf("no carve_build_info in the metrics")
	}
}
