package raftlog

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/carve-net/carve/test/lab/testutil"
)

func TestCloseIsIdempotentAndFinal(t *testing.T) {
	t.Parallel() // its own nodes: loopback listeners, data dirs; it mostly waits on elections
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
