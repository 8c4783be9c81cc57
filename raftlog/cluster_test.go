package raftlog

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/carve-net/carve/internal/lab/testutil"
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

// TestConcurrentAppliesDuringLeaderShutdown checks the guarantee callers rely
// on: an acknowledged command is applied exactly once everywhere, a command
// refused with ErrNotLeader (or not submitted) is never applied, and an
// unknown outcome is applied at most once.
func TestConcurrentAppliesDuringLeaderShutdown(t *testing.T) {
	c := newCluster(t, 3, nil)
	first := c.waitLeader()

	var current atomic.Pointer[testNode]
	current.Store(first)
	var stopped sync.Map            // *testNode -> true once closed
	nodeOf := map[*testNode]*Node{} // read-only while workers run
	for _, tn := range c.nodes {
		nodeOf[tn] = tn.node
	}
	findLeader := func() *testNode {
		for tn, n := range nodeOf {
			if _, dead := stopped.Load(tn); !dead && n.IsLeader() {
				return tn
			}
		}
		return nil
	}

	const workers = 500
	var (
		acked, notApplied, unknown sync.Map // cmd -> struct{}
		nAcked                     atomic.Int64
		stop                       = make(chan struct{})
		wg                         sync.WaitGroup
		unexpected                 = make(chan error, workers)
	)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for seq := 0; ; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				tn := current.Load()
				if tn == nil {
					time.Sleep(20 * time.Millisecond)
					current.CompareAndSwap(nil, findLeader())
					seq--
					continue
				}
				cmd := fmt.Sprintf("w%03d-%06d", w, seq)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, _, err := nodeOf[tn].Apply(ctx, []byte(cmd))
				cancel()
				switch {
				case err == nil:
					acked.Store(cmd, struct{}{})
					nAcked.Add(1)
				case errors.Is(err, ErrUnknownOutcome):
					unknown.Store(cmd, struct{}{})
					current.CompareAndSwap(tn, nil)
				case errors.Is(err, ErrNotLeader), errors.Is(err, ErrClosed),
					errors.Is(err, context.DeadlineExceeded):
					notApplied.Store(cmd, struct{}{})
					current.CompareAndSwap(tn, nil)
				default:
					unexpected <- fmt.Errorf("%s: %w", cmd, err)
					return
				}
			}
		}(w)
	}

	waitAcks := func(n int64) {
		t.Helper()
		testutil.Eventually(t, 60*time.Second, fmt.Sprintf("%d acknowledged applies", n), func() error {
			select {
			case err := <-unexpected:
				t.Fatalf("unexpected Apply error: %v", err)
			default:
			}
			if got := nAcked.Load(); got < n {
				return fmt.Errorf("%d acked", got)
			}
			return nil
		})
	}
	waitAcks(1500)
	stopped.Store(first, true)
	c.stop(first)
	before := nAcked.Load()
	waitAcks(before + 1500)
	close(stop)
	wg.Wait()
	close(unexpected)
	for err := range unexpected {
		t.Fatalf("unexpected Apply error: %v", err)
	}

	survivors := c.running()
	c.waitLeader(survivors...)
	// Make sure everything committed is applied on both survivors.
	_, last := c.apply("final")
	c.waitConverged(last, survivors...)

	var nA, nN, nU int
	for _, tn := range survivors {
		seen := tn.sm.snapshotSeen()
		acked.Range(func(k, _ any) bool {
			if n := seen[k.(string)]; n != 1 {
				t.Errorf("%s: acknowledged %s applied %d times", tn.id, k, n)
			}
			nA++
			return true
		})
		notApplied.Range(func(k, _ any) bool {
			if n := seen[k.(string)]; n != 0 {
				t.Errorf("%s: refused %s applied %d times", tn.id, k, n)
			}
			nN++
			return true
		})
		unknown.Range(func(k, _ any) bool {
			if n := seen[k.(string)]; n > 1 {
				t.Errorf("%s: unknown-outcome %s applied %d times", tn.id, k, n)
			}
			nU++
			return true
		})
		for cmd, n := range seen {
			if cmd == "final" {
				continue
			}
			_, a := acked.Load(cmd)
			_, u := unknown.Load(cmd)
			if !a && !u {
				t.Errorf("%s: %s applied %d times but never acknowledged nor in doubt", tn.id, cmd, n)
			}
		}
	}
	t.Logf("acked %d, refused %d, unknown outcome %d (per survivor)", nA/2, nN/2, nU/2)
}

func TestRestartAllFromDataDirs(t *testing.T) {
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

func TestConsistentRead(t *testing.T) {
	c := newCluster(t, 3, nil)
	leader := c.waitLeader()

	// A fresh leader has only its no-op entry: the barrier path and the
	// trailing non-command entries must not make the read hang.
	idx, err := leader.node.ConsistentRead(ctxTimeout(t, 10*time.Second))
	if err != nil {
		t.Fatalf("ConsistentRead on fresh leader: %v", err)
	}
	if idx == 0 {
		t.Fatal("ConsistentRead returned index 0")
	}
	for _, f := range c.followers() {
		if _, err := f.node.ConsistentRead(ctxTimeout(t, 5*time.Second)); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("ConsistentRead on follower: %v, want ErrNotLeader", err)
		}
	}

	var maxAcked atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, idx, err := leader.node.Apply(ctx, []byte(fmt.Sprintf("r%d-%d", w, i)))
				cancel()
				if err != nil {
					continue
				}
				for {
					m := maxAcked.Load()
					if idx <= m || maxAcked.CompareAndSwap(m, idx) {
						break
					}
				}
			}
		}(w)
	}
	for i := 0; i < 100; i++ {
		before := maxAcked.Load()
		idx, err := leader.node.ConsistentRead(ctxTimeout(t, 10*time.Second))
		if err != nil {
			t.Fatalf("ConsistentRead: %v", err)
		}
		if idx < before {
			t.Fatalf("ConsistentRead = %d < acknowledged %d", idx, before)
		}
		if got := leader.sm.fingerprint().LastIndex; got < before {
			t.Fatalf("state at index %d after ConsistentRead, acknowledged %d", got, before)
		}
	}
	close(stop)
	wg.Wait()

	// After a leader change, the new leader's reads cover what the old one
	// acknowledged.
	acked := maxAcked.Load()
	c.stop(leader)
	next := c.waitLeader()
	idx, err = next.node.ConsistentRead(ctxTimeout(t, 10*time.Second))
	if err != nil {
		t.Fatalf("ConsistentRead on new leader: %v", err)
	}
	if idx < acked || next.sm.fingerprint().LastIndex < acked {
		t.Fatalf("new leader read index %d, state %d, acknowledged %d", idx, next.sm.fingerprint().LastIndex, acked)
	}
}

func TestCloseIsIdempotentAndFinal(t *testing.T) {
	c := newCluster(t, 1, nil)
	tn := c.nodes[0]
	c.waitLeader()
	c.apply("one")
	n := tn.node
	if err := n.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := n.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	tn.node = nil
	ctx := ctxTimeout(t, 5*time.Second)
	if _, _, err := n.Apply(ctx, []byte("two")); !errors.Is(err, ErrClosed) || errors.Is(err, ErrUnknownOutcome) {
		t.Errorf("Apply after Close: %v, want ErrClosed", err)
	}
	if _, err := n.ConsistentRead(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("ConsistentRead after Close: %v", err)
	}
	if err := n.WaitApplied(ctx, 1<<40); !errors.Is(err, ErrClosed) {
		t.Errorf("WaitApplied after Close: %v", err)
	}
	if err := n.AddVoter(ctx, "x", "127.0.0.1:1"); !errors.Is(err, ErrClosed) {
		t.Errorf("AddVoter after Close: %v", err)
	}
	if err := n.RemoveServer(ctx, "x"); !errors.Is(err, ErrClosed) {
		t.Errorf("RemoveServer after Close: %v", err)
	}
	if err := n.TakeSnapshot(); !errors.Is(err, ErrClosed) {
		t.Errorf("TakeSnapshot after Close: %v", err)
	}
	if st := n.Status(); st.Role != "shutdown" {
		t.Errorf("role after Close = %q", st.Role)
	}
	// The data dir is released: the node opens again with its state.
	c.start(tn, c.peers)
	c.waitLeader()
	c.waitConverged(1)
	if got := tn.sm.times("one"); got != 1 {
		t.Fatalf("after reopen %q applied %d times", "one", got)
	}
}

// gatedSM is a testSM whose Apply of the command gate says so on entered
// and then holds raft's FSM goroutine until release is closed: while it
// waits, that Apply is provably in flight, and every later one with it.
type gatedSM struct {
	*testSM
	gate    string
	entered chan struct{}
	release chan struct{}
}

func (s *gatedSM) Apply(index uint64, cmd []byte) any {
	if string(cmd) == s.gate {
		close(s.entered)
		<-s.release
	}
	return s.testSM.Apply(index, cmd)
}

// TestCloseWithApplyInFlight: Close ends every Apply under way with
// ErrClosed or ErrUnknownOutcome at once, without waiting for the state
// machine. The gated command is being applied (the state machine holds it)
// when Close starts, so its future cannot complete: only Close can end its
// wait, and nothing is released before every Apply has returned.
func TestCloseWithApplyInFlight(t *testing.T) {
	c := &cluster{t: t}
	tn := c.newTestNode()
	c.peers = []Server{{ID: tn.id, Address: tn.addr, Voter: true}}
	sm := &gatedSM{testSM: newTestSM(), gate: "gated", entered: make(chan struct{}), release: make(chan struct{})}
	release := sync.OnceFunc(func() { close(sm.release) })
	t.Cleanup(release) // before the node's cleanup (LIFO): Close waits for the FSM
	n, err := Open(context.Background(), c.config(tn, c.peers), sm)
	if err != nil {
		t.Fatal(err)
	}
	tn.sm, tn.node = sm.testSM, n
	c.waitLeader()

	gated := make(chan error, 1)
	go func() {
		_, _, err := n.Apply(context.Background(), []byte(sm.gate))
		gated <- err
	}()
	waitClosed(t, sm.entered, "the state machine to apply the gated command")
	// More Applies behind it: raft may take them or not before Close; none
	// can complete while the state machine is held.
	const queued = 50
	errs := make(chan error, queued)
	for i := range queued {
		go func() {
			_, _, err := n.Apply(context.Background(), []byte(fmt.Sprint("queued-", i)))
			errs <- err
		}()
	}

	closed := make(chan error, 1)
	go func() { closed <- n.Close() }()
	select {
	case err := <-gated:
		if !errors.Is(err, ErrUnknownOutcome) || !errors.Is(err, ErrClosed) {
			t.Errorf("Apply in flight at Close: %v, want ErrUnknownOutcome and ErrClosed", err)
		}
	case <-time.After(testutil.WaitLimit):
		t.Fatal("the Apply in flight still waits for the state machine after Close started")
	}
	for range queued {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrClosed) && !errors.Is(err, ErrUnknownOutcome) {
				t.Errorf("Apply queued at Close: %v", err)
			}
		case <-time.After(testutil.WaitLimit):
			t.Fatal("an Apply queued at Close still waits for the state machine")
		}
	}

	release()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(testutil.WaitLimit):
		t.Fatal("Close did not return once the state machine was released")
	}
	tn.node = nil
	if got := sm.times(sm.gate); got > 1 {
		t.Errorf("gated command applied %d times", got)
	}
}

// waitClosed waits for ch to be closed, at most testutil.WaitLimit.
func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(testutil.WaitLimit):
		t.Fatalf("waiting for %s (up to %s)", what, testutil.WaitLimit)
	}
}

func TestApplyContext(t *testing.T) {
	c := newCluster(t, 1, nil)
	leader := c.waitLeader()
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	if _, _, err := leader.node.Apply(expired, []byte("late")); !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrUnknownOutcome) {
		t.Errorf("Apply with expired ctx: %v", err)
	}
	canceled, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if _, _, err := leader.node.Apply(canceled, []byte("canceled")); !errors.Is(err, context.Canceled) || errors.Is(err, ErrUnknownOutcome) {
		t.Errorf("Apply with canceled ctx: %v", err)
	}
	_, last := c.apply("ok")
	c.waitConverged(last)
	if leader.sm.times("late") != 0 || leader.sm.times("canceled") != 0 {
		t.Error("command applied although ctx had ended before the call")
	}
	// WaitApplied honours ctx for an index that will not come.
	ctx, cancel3 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel3()
	if err := leader.node.WaitApplied(ctx, last+1000); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitApplied beyond the log: %v", err)
	}
}

func TestLeaderChangesSignalled(t *testing.T) {
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

func TestOpenWithoutPeersDoesNotBootstrap(t *testing.T) {
	sm := newTestSM()
	n, err := Open(context.Background(), Config{
		ID: "lonely", RaftAddr: "127.0.0.1:0", DataDir: t.TempDir(), Logger: testLogger("lonely"),
	}, sm)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	if n.bootstrapped {
		t.Fatal("bootstrapped without being in Peers")
	}
	// Without a configuration it has no voter to elect, itself included.
	st := n.Status()
	if st.Role != "follower" || st.LeaderID != "" || len(st.Servers) != 0 || st.CaughtUp {
		t.Fatalf("status %+v", st)
	}
	if _, _, err := n.Apply(ctxTimeout(t, time.Second), []byte("x")); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("Apply: %v", err)
	}
}

// A node restarted alone holds only what its snapshot and its own log give
// it, and does not know what the cluster committed: it is not caught up. It
// is once a leader has told it the commit index and it has applied that.
func TestCaughtUpOnlyAfterHearingFromALeader(t *testing.T) {
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
