package master

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestSilentAgentIsNotOK (issue 20, finding 7): an agent the leader has
// not heard from for longer than the threshold is listed in
// /cluster/status, and its STATUS_OK overlays show STATUS_FAILED saying
// since when; heard again (a usage report), it is OK again. An agent that
// keeps reporting stays OK.
func TestSilentAgentIsNotOK(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	c := newTestClusterWith(t, 1, netconfig.Default(), nil, func(o *Options) { o.AgentSilentAfter = 3 * time.Second })
	c.waitLeader()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := c.client(0)
	for i, id := range []string{"quiet", "alive"} {
		info, err := registerRetrying(ctx, cl, api.RegisterRequest{AgentID: id, IP: fmt.Sprintf("198.18.0.%d", i+1)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cl.Report(ctx, id, api.ReportRequest{Version: info.Version, Overlays: []api.OverlayReport{{Name: "carve", Status: api.StatusOK}}}); err != nil {
			t.Fatal(err)
		}
	}
	status := func(id string) api.OverlayState {
		st, err := cl.State(ctx, apiclient.StateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range st.Agents {
			if a.AgentID == id {
				return a.Overlays[0].State
			}
		}
		t.Fatalf("no agent %s", id)
		return api.OverlayState{}
	}
	if s := status("quiet"); s.Status != api.StatusOK {
		t.Fatalf("quiet after its report: %+v", s)
	}
	keepAlive := time.NewTicker(500 * time.Millisecond)
	defer keepAlive.Stop()
	testutil.Eventually(t, 0, "quiet to be silent", func() error {
		select {
		case <-keepAlive.C:
			if _, err := cl.ReportUsage(ctx, "alive", api.UsageReport{}); err != nil {
				return err
			}
		default:
		}
		cs, err := cl.ClusterStatus(ctx)
		if err != nil {
			return err
		}
		if len(cs.SilentAgents) != 1 || cs.SilentAgents[0].AgentID != "quiet" || cs.SilentAfter != "3s" {
			return fmt.Errorf("silent agents %+v after %q", cs.SilentAgents, cs.SilentAfter)
		}
		return nil
	})
	if s := status("quiet"); s.Status != api.StatusFailed || !strings.Contains(s.Error, "agent silent: not heard from since") {
		t.Errorf("silent quiet: %+v, want STATUS_FAILED saying it is silent", s)
	}
	if s := status("alive"); s.Status != api.StatusOK {
		t.Errorf("alive, which reports: %+v", s)
	}
	if _, err := cl.ReportUsage(ctx, "quiet", api.UsageReport{}); err != nil {
		t.Fatal(err)
	}
	if s := status("quiet"); s.Status != api.StatusOK {
		t.Errorf("quiet heard again: %+v, want STATUS_OK", s)
	}
}
