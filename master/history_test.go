package master

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master/netconfig"
	"github.com/carve-net/carve/test/lab/testutil"
)

// historyRefusals sums carve_raft_history_refused_total on m (0 when the
// metric does not exist).
func historyRefusals(t *testing.T, m *Master) float64 {
	t.Helper()
	mfs, err := m.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == "carve_raft_history_refused_total" {
			for _, mt := range mf.GetMetric() {
				sum += mt.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// TestWholeRestoreRefusesOldDataDir replays issue 27, item 2, in process
// with TLS, down to its symptom: the old data directory holds a Raft
// snapshot with records written after the saved snapshot, so a master
// started on it begins with the old history's state. After a
// whole-cluster restore (Options.RestoreFrom on empty data directories)
// that master must be refused by the restored ones, both ways (no entry,
// no vote), instead of matching their log and serving the old records
// beside the new ones; the restored masters never hold an old record.
func TestWholeRestoreRefusesOldDataDir(t *testing.T) {
	p := newTestPKI(t)
	c := newTestClusterWith(t, 3, netconfig.Default(), p)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	leader := c.waitLeader()
	registered := 0
	register := func(first int, ids ...string) {
		t.Helper()
		for _, id := range ids {
			registered++
			ip := fmt.Sprintf("198.18.7.%d", 10+registered)
			if _, err := registerRetrying(ctx, c.client(first), api.RegisterRequest{AgentID: id, IP: ip}); err != nil {
				t.Fatalf("register %s: %v", id, err)
			}
		}
	}
	register(leader, "kept-1", "kept-2")
	c.waitConverged()
	var snap bytes.Buffer
	if err := c.masters[leader].Table().WriteSnapshot(&snap); err != nil {
		t.Fatal(err)
	}
	register(leader, "old-1", "old-2", "old-3")
	c.waitConverged()
	const stale = 2
	// The old history's state, in a Raft snapshot of the stale master's
	// data directory.
	if err := c.masters[stale].Node().TakeSnapshot(); err != nil {
		t.Fatal(err)
	}
	oldDir := c.dirs[stale]
	for i := range c.masters {
		c.stop(i)
	}
	for i := range c.masters {
		c.dirs[i] = t.TempDir()
		opts := c.options(i)
		opts.RestoreFrom = snap.Bytes()
		c.startWith(i, opts)
	}
	c.waitLeader()
	restored := c.masters[0].Table().LastRestore()
	if restored == nil {
		t.Fatal("no restore after --restore-from")
	}

	// The mistake: the stale master back on its data directory of before.
	c.stop(stale)
	leader = c.waitLeader()
	c.dirs[stale] = oldDir
	c.start(stale)
	register(leader, "new-1", "new-2")

	old := c.masters[stale]
	testutil.Eventually(t, 0, "the restored masters to refuse the master of the old history", func() error {
		if n := historyRefusals(t, c.masters[leader]); n == 0 {
			return fmt.Errorf("no refusal on the leader; the stale master (caught up %t, leader %q) holds agents %v at index %d",
				old.node.IsCaughtUp(), old.node.Status().LeaderID, agentIDs(old), old.Table().State().Index)
		}
		if n := historyRefusals(t, old); n == 0 {
			return errors.New("no refusal on the stale master")
		}
		return nil
	})
	for i, m := range c.masters {
		has := func(id string) bool { _, ok := m.Table().Agent(id); return ok }
		if i == stale {
			if has("new-1") || old.node.IsCaughtUp() {
				t.Errorf("the master of the old history took the restored log: agents %v, caught up %t", agentIDs(m), old.node.IsCaughtUp())
			}
			continue
		}
		if has("old-1") || !has("new-1") {
			t.Errorf("%s holds agents %v: want new-1 and none of the old history's", c.ids[i], agentIDs(m))
		}
	}
	// Both sides say so. In this process every master is on 127.0.0.1, so
	// the restored masters' own handshakes (same host, same history) may
	// clear the leader's conflict until the stale master dials again: wait
	// for a moment when both show it.
	testutil.Eventually(t, 0, "both sides' status to name the conflict", func() error {
		st, ost := c.masters[leader].ClusterStatus(), old.ClusterStatus()
		if st.History == "" || st.History == ost.History || st.HistoryConflict == "" || ost.HistoryConflict == "" {
			return fmt.Errorf("status: the leader's history %q (conflict %q), the stale master's %q (conflict %q); want two histories and both conflicts",
				st.History, st.HistoryConflict, ost.History, ost.HistoryConflict)
		}
		return nil
	})
}

// agentIDs are the agents of m's table.
func agentIDs(m *Master) []string {
	var ids []string
	for _, a := range m.Table().State().Agents {
		ids = append(ids, a.AgentID)
	}
	return ids
}
