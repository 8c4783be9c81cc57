package agent

// Masters that answer again are followed at once, not after a long poll.

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/carve-net/carve/api"
	"github.com/carve-net/carve/master"
	"github.com/carve-net/carve/test/lab/fakegossip"
	"github.com/carve-net/carve/test/lab/testutil"
)

// TestMastersBackAreFollowedAtOnce: an agent whose masters answered 503
// for a while (no quorum) and then answer again at the index the agent
// already has reports them reachable within a backoff step, not after its
// state watch's long poll (WatchWait, here a minute) ran out at masters
// that had nothing new to say.
func TestMastersBackAreFollowedAtOnce(t *testing.T) {
	const watchWait = time.Minute
	hosts, dir, m := hostsWithMaster(t, 1)
	gnet := fakegossip.New(fakegossip.Config{Seed: 21, GossipInterval: 300 * time.Millisecond})
	t.Cleanup(gnet.Close)
	t.Logf("fake gossip seed %d", gnet.Seed())
	proxy := newMasterProxy(t, m)
	a := runAgent(t, newTestAgent(t, hosts[0], proxy.URL(), filepath.Join(dir, "a0"), gnet, func(c *Config) { c.WatchWait = watchWait }))
	index := quietAtMasterIndex(t, a.Agent, m)

	proxy.setDown(true)
	testutil.Eventually(t, 0, "the agent finds the masters gone", testutil.True(func() bool { return !a.Peers().MastersReachable }))
	proxy.setDown(false)
	start := time.Now()
	testutil.Eventually(t, maxWatchRetry+5*time.Second, "the agent finds the masters back", testutil.True(func() bool { return a.Peers().MastersReachable }))
	t.Logf("followed again after %v (watch wait %v)", time.Since(start).Round(time.Millisecond), watchWait)
	if got := masterState(t, m).Index; got != index {
		t.Errorf("the master's index moved from %d to %d: the test no longer shows a watch at an unchanged index", index, got)
	}
}

// TestMastersReachableRightAfterRestart (issue 27, item 5): an agent
// restarted on its data dir while the masters stay at the index it had
// persisted reports them reachable within a backoff step: its first read
// does not wait on the watch (before, it held a long poll of WatchWait at
// masters with nothing new, and reported them unreachable meanwhile).
func TestMastersReachableRightAfterRestart(t *testing.T) {
	const watchWait = time.Minute
	hosts, dir, m := hostsWithMaster(t, 1)
	gnet := fakegossip.New(fakegossip.Config{Seed: 23, GossipInterval: 300 * time.Millisecond})
	t.Cleanup(gnet.Close)
	t.Logf("fake gossip seed %d", gnet.Seed())
	dataDir := filepath.Join(dir, "a0")
	withWait := func(c *Config) { c.WatchWait = watchWait }
	a := runAgent(t, newTestAgent(t, hosts[0], "http://"+m.HTTPAddr(), dataDir, gnet, withWait))
	index := quietAtMasterIndex(t, a.Agent, m)
	a.stop(t)
	restarted := runAgent(t, newTestAgent(t, hosts[0], "http://"+m.HTTPAddr(), dataDir, gnet, withWait))
	start := time.Now()
	testutil.Eventually(t, maxWatchRetry+5*time.Second, "the restarted agent finds the masters reachable", testutil.True(func() bool { return restarted.Peers().MastersReachable }))
	t.Logf("reachable %v after the restart (watch wait %v)", time.Since(start).Round(time.Millisecond), watchWait)
	if got := masterState(t, m).Index; got != index {
		t.Logf("the master's index moved from %d to %d during the restart (a report): the read did not have to wait", index, got)
	}
}

// quietAtMasterIndex waits until the agent has reported its configuration
// (a commit) and read up to the master's index, so that nothing moves the
// index any more, and returns that index.
func quietAtMasterIndex(t *testing.T, a *Agent, m *master.Master) uint64 {
	t.Helper()
	var index uint64
	testutil.Eventually(t, 0, "the agent reaches the master's index", func() error {
		st := masterState(t, m)
		if len(st.Agents) != 1 || len(st.Agents[0].Overlays) == 0 || st.Agents[0].Overlays[0].State.Status != api.StatusOK {
			return fmt.Errorf("master state %+v", st.Agents)
		}
		if p := a.Peers(); !p.MastersReachable || p.MasterIndex != st.Index {
			return fmt.Errorf("agent at index %d reachable %v, master at %d", p.MasterIndex, p.MastersReachable, st.Index)
		}
		index = st.Index
		return nil
	})
	return index
}
