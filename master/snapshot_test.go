package master

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/api/apiclient"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/master/state"
	"github.com/carve-net/carve/pki"
	"github.com/carve-net/carve/test/lab/testutil"
)

func TestSnapshotSaveAndRestore(t *testing.T) {
	t.Parallel() // its own masters: loopback ports, data dirs; it mostly waits on Raft
	if testing.Short() {
		t.Skip("cluster test")
	}
	forEachSecurity(t, testSnapshotSaveAndRestore)
}

// testSnapshotSaveAndRestore: a snapshot saved through a follower, churn
// (a new agent, a deleted one), then the snapshot restored through a
// follower: every master shows the snapshot's agents, versioned at the
// restore's index, a tombstone of the agent of the churn, and the restore
// (signed with TLS); the changes since an index before the restore are
// gone. Agents may do neither.
func testSnapshotSaveAndRestore(t *testing.T, p *testPKI) {
	c := newTestClusterWith(t, 3, netconfig.Default(), p)
	leader := c.waitLeader()
	follower := (leader + 1) % 3
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := c.clientAs(follower, "alice", pki.RoleOperator)
	for _, id := range []string{"a1", "a2"} {
		if _, err := registerRetrying(ctx, cl, api.RegisterRequest{AgentID: id, IP: "198.18.0." + id[1:]}); err != nil {
			t.Fatal(err)
		}
	}
	snap, err := cl.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	info, err := state.CheckSnapshot(snap)
	if err != nil || info.Agents != 2 {
		t.Fatalf("snapshot: %+v, %v; want 2 agents", info, err)
	}

	// The churn.
	if _, err := registerRetrying(ctx, cl, api.RegisterRequest{AgentID: "churn", IP: "198.18.0.9"}); err != nil {
		t.Fatal(err)
	}
	if err := cl.DeleteAgent(ctx, "a2"); err != nil {
		t.Fatal(err)
	}
	before, err := cl.State(ctx, apiclient.StateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// Agents may neither save nor restore.
	agent := c.clientAs(follower, "a1", pki.RoleAgent)
	if p != nil {
		if _, err := agent.Snapshot(ctx); !api.IsCode(err, api.CodeForbidden) {
			t.Errorf("an agent saved a snapshot: %v", err)
		}
		if _, err := agent.RestoreSnapshot(ctx, snap); !api.IsCode(err, api.CodeForbidden) {
			t.Errorf("an agent restored a snapshot: %v", err)
		}
	}
	// What is not a snapshot is refused, naming what it is.
	for _, bad := range []string{`{"format":99,"agents":[]}`, `"x"`, `{"format":3,"agents":[]}`} {
		var e *api.Error
		if _, err := cl.RestoreSnapshot(ctx, []byte(bad)); !errors.As(err, &e) || e.Status != 400 {
			t.Errorf("restore of %s: %v, want a 400", bad, err)
		}
	}

	r, err := cl.RestoreSnapshot(ctx, snap)
	if err != nil {
		t.Fatal(err)
	}
	if r.Epoch == 0 || r.Index <= before.Index || r.From != info.StateIndex {
		t.Fatalf("restore %+v: want an epoch, an index above %d, from %d", r, before.Index, info.StateIndex)
	}
	c.waitConverged()
	for i, m := range c.running() {
		st, _, err := m.table.StateJSON("")
		if err != nil {
			t.Fatal(err)
		}
		var got api.State
		if err := json.Unmarshal(st, &got); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, a := range got.Agents {
			ids = append(ids, a.AgentID)
			if a.Version != r.Index {
				t.Errorf("master %d: agent %s at version %d, want the restore's %d", i, a.AgentID, a.Version, r.Index)
			}
		}
		if !slices.Equal(ids, []string{"a1", "a2"}) {
			t.Errorf("master %d: agents %v after the restore, want a1 a2", i, ids)
		}
		if !slices.ContainsFunc(got.Tombstones, func(tb api.Tombstone) bool { return tb.AgentID == "churn" && tb.Version == r.Index }) {
			t.Errorf("master %d: no tombstone of churn at %d: %+v", i, r.Index, got.Tombstones)
		}
		if got.Restore == nil || got.Restore.Epoch != r.Epoch || got.ClusterID != before.ClusterID {
			t.Fatalf("master %d: restore %+v cluster %q, want epoch %d of cluster %s", i, got.Restore, got.ClusterID, r.Epoch, before.ClusterID)
		}
		if p != nil {
			if err := api.VerifyRestore(p.SigningKey.Public().(ed25519.PublicKey), *got.Restore, got.ClusterID); err != nil {
				t.Errorf("master %d: %v", i, err)
			}
		}
	}
	if _, err := cl.Changes(ctx, before.Index, 0); !api.IsCode(err, api.CodeGone) {
		t.Errorf("changes since %d, before the restore: %v, want 410 gone", before.Index, err)
	}
	// A restore again moves the epoch on.
	r2, err := cl.RestoreSnapshot(ctx, snap)
	if err != nil {
		t.Fatal(err)
	}
	if r2.Epoch <= r.Epoch {
		t.Errorf("second restore epoch %d, not above %d", r2.Epoch, r.Epoch)
	}
	// Registrations go on after it.
	testutil.Eventually(t, 0, "a registration after the restore", func() error {
		_, err := cl.Register(ctx, api.RegisterRequest{AgentID: "a3", IP: "198.18.0.3"})
		return err
	})
}
