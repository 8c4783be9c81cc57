package raftlog

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/carve-net/carve/test/lab/testutil"
)

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
