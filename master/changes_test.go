package master

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestChangesWatchOnFollower: on a secure 3-master cluster, an agent's
// changes watch on a follower wakes on a registration sent to the leader
// and holds that record alone, signed; the leader compacts a deleted
// agent's tombstone after the configured age on every master, and a watch
// from before the horizon is answered 410 with the oldest index served.
func TestChangesWatchOnFollower(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test")
	}
	p := newTestPKI(t)
	c := newTestClusterWith(t, 3, netconfig.Default(), p, func(o *Options) {
		o.TombstoneMaxAge, o.CompactEvery = 300*time.Millisecond, 50*time.Millisecond
	})
	leader := c.waitLeader()
	follower := (leader + 1) % 3
	c.waitConverged()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	op := c.clientAs(leader, "op", pki.RoleOperator)
	doomed, err := op.Register(ctx, api.RegisterRequest{AgentID: "doomed", IP: "198.18.0.9"})
	if err != nil {
		t.Fatal(err)
	}
	watcher := c.clientAs(follower, "watcher", pki.RoleAgent)
	st, err := watcher.State(ctx, apiclient.StateOptions{Index: doomed.Version - 1, Wait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		ch  *api.Changes
		err error
	}
	woke := make(chan result, 1)
	go func() {
		ch, err := watcher.Changes(ctx, st.Index, 30*time.Second)
		woke <- result{ch, err}
	}()
	info, err := op.Register(ctx, api.RegisterRequest{AgentID: "newcomer", IP: "198.18.0.10"})
	if err != nil {
		t.Fatal(err)
	}
	r := <-woke
	if r.err != nil {
		t.Fatalf("changes watch on the follower: %v", r.err)
	}
	if len(r.ch.Agents) != 1 || r.ch.Agents[0].AgentID != "newcomer" || r.ch.Index != info.Version || r.ch.Network != nil || len(r.ch.Tombstones) != 0 {
		t.Fatalf("changes %+v, want newcomer alone at index %d", r.ch, info.Version)
	}
	key, err := api.ParseSigningKey(r.ch.SigningKey)
	if err != nil || r.ch.ClusterID != st.ClusterID {
		t.Fatalf("changes signing key %q (%v), cluster %q want %q", r.ch.SigningKey, err, r.ch.ClusterID, st.ClusterID)
	}
	if err := api.VerifyRecord(key, &r.ch.Agents[0], r.ch.ClusterID); err != nil {
		t.Fatalf("newcomer's record in the changes: %v", err)
	}

	if err := op.DeleteAgent(ctx, "doomed"); err != nil {
		t.Fatal(err)
	}
	tomb, _ := c.masters[leader].table.Tombstone("doomed")
	for _, m := range c.running() {
		testutil.Eventually(t, 0, m.opts.ID+" compacts doomed's tombstone", func() error {
			if _, ok := m.table.Tombstone("doomed"); ok || m.table.Horizon() < tomb {
				return fmt.Errorf("horizon %d, tombstone at %d", m.table.Horizon(), tomb)
			}
			return nil
		})
	}
	_, err = watcher.Changes(ctx, st.Index, 0)
	var apiErr *api.Error
	if !errors.As(err, &apiErr) || apiErr.Status != 410 || apiErr.Code != api.CodeGone || apiErr.Oldest < tomb {
		t.Fatalf("changes since %d after the horizon passed %d: %v, want 410 gone with the oldest index", st.Index, tomb, err)
	}
	if _, err := watcher.Changes(ctx, apiErr.Oldest, 0); err != nil {
		t.Fatalf("changes since the oldest index served (%d): %v", apiErr.Oldest, err)
	}
	full, err := watcher.State(ctx, apiclient.StateOptions{})
	if err != nil || full.Horizon < tomb || slices.ContainsFunc(full.Tombstones, func(tb api.Tombstone) bool { return tb.AgentID == "doomed" }) {
		t.Fatalf("state after compaction: horizon %d, tombstones %+v (%v)", full.Horizon, full.Tombstones, err)
	}
}
