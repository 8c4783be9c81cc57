package master

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/test/lab/testutil"
)

// A master restarted without quorum has not caught up with a leader: it
// answers 503 to state reads instead of serving its old (or empty) table as
// the truth. Once the others are back it serves again, with the same
// cluster id.
func TestRestartedAloneDoesNotServeItsTable(t *testing.T) {
	t.Parallel() // its own masters: loopback ports, data dirs; it mostly waits on Raft
	if testing.Short() {
		t.Skip("cluster test")
	}
	for _, snapshot := range []bool{false, true} {
		t.Run(fmt.Sprintf("snapshot=%v", snapshot), func(t *testing.T) {
			c := newTestCluster(t, 3, netconfig.Default())
			leader := c.waitLeader()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cl := c.client(leader)
			for i := range 6 {
				if _, err := registerRetrying(ctx, cl, api.RegisterRequest{AgentID: fmt.Sprintf("a%d", i), IP: fmt.Sprintf("198.18.0.%d", i+1)}); err != nil {
					t.Fatal(err)
				}
				if snapshot && i == 2 {
					// m1 restarts from a snapshot with an older table.
					if err := c.masters[0].node.TakeSnapshot(); err != nil {
						t.Fatal(err)
					}
				}
			}
			c.waitConverged()
			before, err := cl.State(ctx, apiclient.StateOptions{Consistent: true})
			if err != nil {
				t.Fatal(err)
			}
			if before.ClusterID == "" {
				t.Fatalf("the state has no cluster_id (index %d)", before.Index)
			}
			for _, m := range c.running() {
				if id := m.table.ClusterID(); id != before.ClusterID {
					t.Errorf("%s has cluster id %q, the state says %q", m.opts.ID, id, before.ClusterID)
				}
			}
			for i := range c.masters {
				c.stop(i)
			}
			c.start(0)
			if st := c.masters[0].node.Status(); snapshot && st.LastSnapshotIndex == 0 {
				t.Fatalf("m1 restarted without its snapshot: %+v", st)
			}
			base := "http://" + c.httpAddrs[0]
			for _, path := range []string{
				"/overlay-master/state",
				fmt.Sprintf("/overlay-master/state?index=%d&wait=1s", before.Index),
				"/overlay-master/state?index=0&wait=1s",
				"/overlay-master/agents/a0",
			} {
				status, hdr, data := httpCall(t, "GET", base+path, "", nil)
				var e api.Error
				_ = json.Unmarshal(data, &e)
				if status != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" || e.Code != api.CodeNoLeader {
					t.Errorf("GET %s on a master alone after a restart: %d Retry-After %q %s; want 503 %q with Retry-After",
						path, status, hdr.Get("Retry-After"), data, api.CodeNoLeader)
				}
			}
			c.start(1)
			c.start(2)
			c.waitLeader()
			only, err := apiclient.NewClient([]string{base}, nil)
			if err != nil {
				t.Fatal(err)
			}
			testutil.Eventually(t, 0, "m1 to serve the state again", func() error {
				st, err := only.State(ctx, apiclient.StateOptions{})
				if err != nil {
					return err
				}
				if st.ClusterID != before.ClusterID || len(st.Agents) != len(before.Agents) || st.Index < before.Index {
					return fmt.Errorf("cluster_id %q index %d agents %d, want %q, >= %d, %d",
						st.ClusterID, st.Index, len(st.Agents), before.ClusterID, before.Index, len(before.Agents))
				}
				return nil
			})
			cs, err := only.ClusterStatus(ctx)
			if err != nil || cs.ClusterID != before.ClusterID || !cs.CaughtUp {
				t.Errorf("cluster status after catching up: %+v %v, want cluster_id %q", cs, err, before.ClusterID)
			}
		})
	}
}
