package raftlog

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/carve-net/carve/test/lab/testutil"
)

func TestAddVoterCatchesUpViaSnapshotAndRemove(t *testing.T) {
	c := newCluster(t, 3, func(cfg *Config) {
		cfg.TrailingLogs = 10
		cfg.SnapshotThreshold = 1 << 20 // only explicit snapshots
	})
	leader := c.waitLeader()
	last := c.applyN("x", 150)
	c.waitConverged(last)
	if err := leader.node.TakeSnapshot(); err != nil {
		t.Fatal(err)
	}

	// The joiner knows the other peers but is not among them: it must not
	// bootstrap a cluster of its own.
	joiner := c.newTestNode()
	c.start(joiner, c.peers)
	if joiner.node.bootstrapped {
		t.Fatal("joiner bootstrapped")
	}
	if st := joiner.node.Status(); len(st.Servers) != 0 || st.Role != "follower" {
		t.Fatalf("joiner status before join: %+v", st)
	}

	for _, f := range c.followers() {
		if f == joiner {
			continue
		}
		if err := f.node.AddVoter(ctxTimeout(t, 5*time.Second), joiner.id, joiner.addr); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("AddVoter on follower: %v, want ErrNotLeader", err)
		}
		if err := f.node.RemoveServer(ctxTimeout(t, 5*time.Second), joiner.id); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("RemoveServer on follower: %v, want ErrNotLeader", err)
		}
	}
	leader = c.waitLeader(c.nodes[:3]...)
	for i := 0; i < 2; i++ { // second call is a no-op
		if err := leader.node.AddVoter(ctxTimeout(t, 10*time.Second), joiner.id, joiner.addr); err != nil {
			t.Fatalf("AddVoter #%d: %v", i+1, err)
		}
	}
	fp := c.waitConverged(last)
	if fp.Count != 150 {
		t.Fatalf("count = %d", fp.Count)
	}
	if joiner.sm.restoreCount() == 0 {
		t.Fatal("joiner caught up without InstallSnapshot although the log was compacted")
	}
	testutil.Eventually(t, 10*time.Second, "4 voters everywhere", func() error {
		for _, tn := range c.running() {
			st := tn.node.Status()
			voters := 0
			for _, s := range st.Servers {
				if s.Voter {
					voters++
				}
			}
			if voters != 4 {
				return fmt.Errorf("%s sees %+v", tn.id, st.Servers)
			}
		}
		return nil
	})
	last = c.applyN("y", 10)
	c.waitConverged(last)

	leader = c.waitLeader()
	for _, id := range []string{joiner.id, joiner.id, "no-such-node"} {
		if err := leader.node.RemoveServer(ctxTimeout(t, 10*time.Second), id); err != nil {
			t.Fatalf("RemoveServer(%s): %v", id, err)
		}
	}
	ids := func(tn *testNode) []string {
		var out []string
		for _, s := range tn.node.Status().Servers {
			out = append(out, s.ID)
		}
		sort.Strings(out)
		return out
	}
	want := []string{c.nodes[0].id, c.nodes[1].id, c.nodes[2].id}
	sort.Strings(want)
	testutil.Eventually(t, 10*time.Second, "configuration without the joiner", func() error {
		for _, tn := range c.nodes[:3] {
			if got := ids(tn); !slices.Equal(got, want) {
				return fmt.Errorf("%s sees %v", tn.id, got)
			}
		}
		return nil
	})
	last = c.applyN("z", 10)
	fp = c.waitConverged(last, c.nodes[:3]...)
	if got := joiner.sm.fingerprint(); got.LastIndex >= last {
		t.Fatalf("removed node still receives entries: %+v", got)
	}
	if fp.Count != 170 {
		t.Fatalf("count = %d, want 170", fp.Count)
	}
}
