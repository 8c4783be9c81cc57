package raftlog

import (
	"fmt"
	"testing"
	"time"

	"github.com/carve-net/carve/test/lab/testutil"
)

func TestRestartAllFromDataDirs(t *testing.T) {
	t.Parallel() // its own nodes: loopback listeners, data dirs; it mostly waits on elections
	tests := []struct {
		name     string
		tune     func(*Config)
		snapshot bool // TakeSnapshot on every node before stopping
		wantSnap bool
	}{
		{name: "log only"},
		{name: "TakeSnapshot", snapshot: true, wantSnap: true},
		{name: "SnapshotThreshold", wantSnap: true, tune: func(cfg *Config) {
			cfg.SnapshotThreshold = 40
			cfg.SnapshotInterval = 50 * time.Millisecond
			cfg.TrailingLogs = 10
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster(t, 3, tt.tune)
			c.waitLeader()
			last := c.applyN("a", 120)
			fp := c.waitConverged(last)
			if tt.snapshot {
				for _, tn := range c.nodes {
					if err := tn.node.TakeSnapshot(); err != nil {
						t.Fatalf("%s: TakeSnapshot: %v", tn.id, err)
					}
				}
			}
			if tt.wantSnap {
				testutil.Eventually(t, 20*time.Second, "snapshots on every node", func() error {
					for _, tn := range c.nodes {
						if st := tn.node.Status(); st.LastSnapshotIndex == 0 {
							return fmt.Errorf("%s has no snapshot", tn.id)
						}
					}
					return nil
				})
				// Entries after the snapshot must be replayed from the log.
				last = c.applyN("b", 5)
				fp = c.waitConverged(last)
			}
			for _, tn := range c.nodes {
				c.stop(tn)
			}
			for _, tn := range c.nodes {
				c.start(tn, c.peers)
				if tn.node.bootstrapped {
					t.Fatalf("%s bootstrapped again on restart", tn.id)
				}
				if tt.wantSnap && tn.sm.restoreCount() == 0 {
					t.Errorf("%s: snapshot not restored on start", tn.id)
				}
				if !tt.wantSnap && tn.sm.restoreCount() != 0 {
					t.Errorf("%s: unexpected restore", tn.id)
				}
			}
			c.waitLeader()
			got := c.waitConverged(last)
			if got != fp {
				t.Fatalf("after restart state = %+v, want %+v", got, fp)
			}
			for _, tn := range c.nodes {
				if err := tn.node.WaitApplied(ctxTimeout(t, 10*time.Second), last); err != nil {
					t.Fatalf("%s: %v", tn.id, err)
				}
			}
			// And the cluster keeps working.
			next := c.applyN("c", 3)
			if next <= last {
				t.Fatalf("index after restart %d <= %d", next, last)
			}
			c.waitConverged(next)
		})
	}
}

// A node restarted alone holds only what its snapshot and its own log give
// it, and does not know what the cluster committed: it is not caught up. It
// is once a leader has told it the commit index and it has applied that.
func TestCaughtUpOnlyAfterHearingFromALeader(t *testing.T) {
	t.Parallel() // its own nodes: loopback listeners, data dirs; it mostly waits on elections
	c := newCluster(t, 3, nil)
	c.waitLeader()
	allCaughtUp := func() error {
		for _, tn := range c.running() {
			if !tn.node.IsCaughtUp() {
				return fmt.Errorf("%s is not caught up", tn.id)
			}
		}
		return nil
	}
	testutil.Eventually(t, 0, "every node of a new cluster to catch up", allCaughtUp)
	last := c.applyN("a", 20)
	c.waitConverged(last)
	alone := c.nodes[0]
	if err := alone.node.TakeSnapshot(); err != nil {
		t.Fatal(err)
	}
	last = c.applyN("b", 20)
	c.waitConverged(last)
	for _, tn := range c.nodes {
		c.stop(tn)
	}

	c.start(alone, c.peers)
	if st := alone.node.Status(); st.CaughtUp || alone.node.IsCaughtUp() {
		t.Fatalf("%s is caught up with no other node running: %+v", alone.id, st)
	}
	if got := alone.sm.fingerprint().LastIndex; got >= last {
		t.Fatalf("%s applied %d alone, want only its snapshot (< %d)", alone.id, got, last)
	}
	for _, tn := range c.nodes[1:] {
		c.start(tn, c.peers)
	}
	select {
	case <-alone.node.CaughtUp():
	case <-time.After(testutil.WaitLimit):
		t.Fatalf("%s did not catch up once the others were back", alone.id)
	}
	if got := alone.sm.fingerprint().LastIndex; got < last {
		t.Errorf("%s caught up at applied index %d, before the committed %d", alone.id, got, last)
	}
	testutil.Eventually(t, 0, "every node to catch up after the restart", allCaughtUp)
}
