package raftlog

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestClusterReplicatesAndFollowersRefuse(t *testing.T) {
	regs := map[string]*prometheus.Registry{}
	var mu sync.Mutex
	c := newCluster(t, 3, func(cfg *Config) {
		mu.Lock()
		defer mu.Unlock()
		if regs[cfg.ID] == nil {
			regs[cfg.ID] = prometheus.NewRegistry()
		}
		cfg.Registerer = regs[cfg.ID]
	})
	leader := c.waitLeader()
	for _, tn := range c.nodes {
		if !tn.node.bootstrapped {
			t.Errorf("%s did not bootstrap from Peers", tn.id)
		}
	}

	var prev uint64
	for i := 0; i < 50; i++ {
		res, idx := c.apply(fmt.Sprintf("cmd-%d", i))
		if idx <= prev {
			t.Fatalf("index %d not increasing (prev %d)", idx, prev)
		}
		if res.Count != i+1 {
			t.Fatalf("result count = %d, want %d", res.Count, i+1)
		}
		prev = idx
	}
	fp := c.waitConverged(prev)
	if fp.Count != 50 {
		t.Fatalf("count = %d, want 50", fp.Count)
	}
	for _, tn := range c.nodes {
		for i := 0; i < 50; i++ {
			if n := tn.sm.times(fmt.Sprintf("cmd-%d", i)); n != 1 {
				t.Fatalf("%s applied cmd-%d %d times", tn.id, i, n)
			}
		}
		if err := tn.node.WaitApplied(ctxTimeout(t, 10*time.Second), prev); err != nil {
			t.Fatalf("%s: WaitApplied(%d): %v", tn.id, prev, err)
		}
	}

	for _, f := range c.followers() {
		_, _, err := f.node.Apply(ctxTimeout(t, 5*time.Second), []byte("on-follower"))
		if !errors.Is(err, ErrNotLeader) {
			t.Errorf("Apply on follower %s: err = %v, want ErrNotLeader", f.id, err)
		}
		if errors.Is(err, ErrUnknownOutcome) {
			t.Errorf("Apply on follower %s: ErrNotLeader must not be an unknown outcome", f.id)
		}
		st := f.node.Status()
		if st.Role != "follower" || st.LeaderID != leader.id || st.LeaderAddr != leader.addr {
			t.Errorf("follower status %+v", st)
		}
	}
	st := leader.node.Status()
	if st.Role != "leader" || st.ID != leader.id || st.Addr != leader.addr || st.Term == 0 ||
		st.CommitIndex < prev || st.AppliedIndex < prev || st.LastIndex < prev || len(st.Servers) != 3 {
		t.Errorf("leader status %+v", st)
	}
	for _, s := range st.Servers {
		if !s.Voter || !slices.ContainsFunc(c.peers, func(p Server) bool { return p.ID == s.ID && p.Address == s.Address }) {
			t.Errorf("unexpected server %+v", s)
		}
	}

	// Metrics are registered on the node's own registry.
	mfs, err := regs[leader.id].Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch {
			case m.GetGauge() != nil:
				got[mf.GetName()] = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				got[mf.GetName()] += m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				got[mf.GetName()] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	for name, min := range map[string]float64{
		"carve_raft_state": 2, "carve_raft_is_leader": 1, "carve_raft_applied_index": float64(prev),
		"carve_raft_commit_index": float64(prev), "carve_raft_leader_changes_total": 1,
		"carve_raft_apply_duration_seconds": 50, "carve_raft_apply_errors_total": 0,
		"carve_raft_last_log_index": float64(prev), "carve_raft_term": 1,
	} {
		v, ok := got[name]
		if !ok || v < min {
			t.Errorf("metric %s = %v (present %v), want >= %v", name, v, ok, min)
		}
	}
}

func TestLeaderFailoverAndRestartCatchesUp(t *testing.T) {
	t.Parallel() // its own nodes: loopback listeners, data dirs; it mostly waits on elections
	c := newCluster(t, 3, nil)
	old := c.waitLeader()
	last := c.applyN("before", 30)
	c.waitConverged(last)

	c.stop(old)
	survivors := c.running()
	leader := c.waitLeader(survivors...)
	if leader == old {
		t.Fatal("stopped node is still leader")
	}
	last = c.applyN("after", 30)
	c.waitConverged(last, survivors...)

	c.start(old, c.peers)
	if old.node.bootstrapped {
		t.Fatal("restarted node bootstrapped again")
	}
	fp := c.waitConverged(last)
	if fp.Count != 60 {
		t.Fatalf("count = %d, want 60", fp.Count)
	}
	// The restarted node follows the new leader.
	c.waitLeader()
	last = c.applyN("rejoined", 5)
	c.waitConverged(last)
}

func TestLeaderChangesSignalled(t *testing.T) {
	t.Parallel() // its own nodes: loopback listeners, data dirs; it mostly waits on elections
	c := newCluster(t, 3, nil)
	tn := c.nodes[0]
	sub, cancel := tn.node.Subscribe()
	defer cancel()
	leader := c.waitLeader()
	// Both the shared channel and the subscription got the election.
	for name, ch := range map[string]<-chan struct{}{"LeaderChanges": tn.node.LeaderChanges(), "Subscribe": sub} {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s not signalled on election", name)
		}
	}
	// Drain, then move the leadership and expect a new signal on a survivor.
	watcher := c.nodes[0]
	if watcher == leader {
		watcher = c.nodes[1]
	}
	wsub, wcancel := watcher.node.Subscribe()
	defer wcancel()
	c.stop(leader)
	select {
	case <-wsub:
	case <-time.After(10 * time.Second):
		t.Fatal("no signal after the leader stopped")
	}
	c.waitLeader()
}
