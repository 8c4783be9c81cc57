package goroutines

import (
	"context"
	"sync/atomic"
	"testing"
)

// TestStopWaitsForEveryGoroutine: a goroutine blocked on its context when
// Stop is called has ended when Stop returns.
func TestStopWaitsForEveryGoroutine(t *testing.T) {
	g := New(context.Background())
	var ended atomic.Int32
	started := make(chan struct{}, 3)
	for range 3 {
		if !g.Go(func(ctx context.Context) {
			started <- struct{}{}
			<-ctx.Done()
			ended.Add(1)
		}) {
			t.Fatal("a running group refused a goroutine")
		}
	}
	for range 3 {
		<-started
	}
	g.Stop()
	if n := ended.Load(); n != 3 {
		t.Fatalf("%d of 3 goroutines ended when Stop returned", n)
	}
}

// TestStoppedGroupStartsNothing: after Stop, Go runs nothing and says so;
// a second Stop returns at once.
func TestStoppedGroupStartsNothing(t *testing.T) {
	g := New(context.Background())
	g.Stop()
	ran := false
	if g.Go(func(context.Context) { ran = true }) {
		t.Fatal("a stopped group started a goroutine")
	}
	g.Stop()
	if ran {
		t.Fatal("a stopped group ran f")
	}
}

// TestParentCancelReachesTheGroup: the group's goroutines see their
// parent's cancellation.
func TestParentCancelReachesTheGroup(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	g := New(parent)
	t.Cleanup(g.Stop)
	done := make(chan struct{})
	g.Go(func(ctx context.Context) {
		<-ctx.Done()
		close(done)
	})
	cancel()
	<-done
}

// TestGoRacesStop: goroutines started while another goroutine stops the
// group either run to their end before Stop returns or never run (run
// under -race: the WaitGroup is never added to during the wait).
func TestGoRacesStop(t *testing.T) {
	for range 50 {
		g := New(context.Background())
		var running atomic.Int32
		stopped := make(chan struct{})
		go func() {
			g.Stop()
			if n := running.Load(); n != 0 {
				t.Errorf("%d goroutines still running after Stop", n)
			}
			close(stopped)
		}()
		for range 20 {
			g.Go(func(ctx context.Context) {
				running.Add(1)
				defer running.Add(-1)
				<-ctx.Done()
			})
		}
		<-stopped
	}
}
