package e2e

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/carve-net/carve/internal/retry"
	"github.com/carve-net/carve/test/lab/labcluster"
)

// stream is a runtime that attaches and detaches containers on one host
// from several workers at once while the host's agent is killed and started
// again, and then retries what failed.
type stream struct {
	c       *labcluster.Cluster
	h       *labcluster.Host
	overlay string

	// phase is where the agent's life is (phaseUp ... phaseReady); an
	// operation reads it when it starts and when it ends.
	phase atomic.Int32

	mu sync.Mutex
	// live: ADD succeeded and no DEL did.
	live []*labcluster.Container
	// delFailed: live containers whose DEL failed; the runtime retries it.
	delFailed []*labcluster.Container
	// addFailed: containers whose ADD failed; their cleanup DEL may have failed too.
	addFailed []*labcluster.Container
	// abandoned: failed ADDs the runtime gave up on (never DELed again).
	abandoned []*labcluster.Container
	// outage counts the operations that ran entirely while the agent was dead.
	outageAdds, outageDels int
	ok                     int // successful operations
}

// workers run the stream; each alternates ADD, ADD, DEL of its own containers.
const workers = 8

// The phases of the stream. An operation that ended in phaseUp ran with the
// agent up and must succeed; one that started and ended in phaseDead must
// fail; one that started in phaseReady must succeed. Operations that
// overlap the kill or the restart may go either way.
const (
	phaseUp      = iota // the agent runs
	phaseKilling        // SIGKILL is being sent
	phaseDead           // the agent is gone
	phaseStarted        // started again, maybe not serving yet
	phaseReady          // serving again
)

func (s *stream) run(ctx context.Context, t *testing.T) []*labcluster.Container {
	t.Helper()
	s.live = s.c.AttachedOn(s.h, s.overlay) // the 200 of step 2 stay attached through the crash
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() { s.worker(ctx, t, w, stop) })
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		err := retry.Until(ctx, 10*time.Millisecond, func() error {
			if t.Failed() {
				return retry.Permanent(errors.New("a worker failed"))
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if !cond() {
				return fmt.Errorf("%d ok, %d ADDs and %d DELs in the outage", s.ok, s.outageAdds, s.outageDels)
			}
			return nil
		})
		if err != nil {
			close(stop)
			wg.Wait()
			t.Fatalf("waiting for %s: %v", what, err)
		}
	}

	waitFor("40 operations", func() bool { return s.ok >= 40 })
	s.phase.Store(phaseKilling)
	if err := s.c.KillAgent(s.h); err != nil { // SIGKILL by PID, waits until it is gone
		t.Fatal(err)
	}
	s.phase.Store(phaseDead)
	waitFor("ADDs and DELs during the outage", func() bool { return s.outageAdds >= 5 && s.outageDels >= 5 })
	s.phase.Store(phaseStarted)
	if err := s.c.StartAgent(s.h); err != nil { // the same data dir
		t.Fatal(err)
	}
	if _, err := s.c.WaitAgent(ctx, s.h); err != nil {
		t.Fatal(err)
	}
	if _, err := s.c.IPAMClient(s.h).Status(ctx, s.overlay); err != nil {
		t.Fatal(err)
	}
	s.phase.Store(phaseReady)
	s.mu.Lock()
	okBefore := s.ok
	s.mu.Unlock()
	waitFor("40 operations after the restart", func() bool { return s.ok >= okBefore+40 })
	close(stop)
	wg.Wait()
	s.mu.Lock()
	t.Logf("stream: %d operations succeeded; during the outage %d ADDs and %d DELs failed; %d ADDs and %d DELs to retry",
		s.ok, s.outageAdds, s.outageDels, len(s.addFailed), len(s.delFailed))
	s.mu.Unlock()
	if t.Failed() {
		return nil
	}
	s.retry(ctx, t)
	return s.live
}

func (s *stream) worker(ctx context.Context, t *testing.T, w int, stop <-chan struct{}) {
	var mine []*labcluster.Container
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		default:
		}
		start := s.phase.Load()
		if i%3 != 2 || len(mine) == 0 {
			ct, err := s.c.AddCNIContainer(ctx, s.h, s.overlay, labcluster.CNIOptions{})
			end := s.phase.Load()
			if ct == nil {
				t.Errorf("worker %d: %v", w, err)
				return
			}
			if err == nil {
				if start == phaseDead && end == phaseDead {
					t.Errorf("worker %d: ADD %s succeeded while the agent was dead", w, ct.Name)
				}
				mine = append(mine, ct)
				s.mu.Lock()
				s.live = append(s.live, ct)
				s.ok++
				s.mu.Unlock()
				continue
			}
			if code := labcluster.CNICode(err); code != types.ErrTryAgainLater {
				t.Errorf("worker %d: ADD failed with CNI code %d, want %d (try again later): %v", w, code, types.ErrTryAgainLater, err)
			}
			if end == phaseUp || start == phaseReady {
				t.Errorf("worker %d: ADD failed with the agent up: %v", w, err)
			}
			// The bridge plugin leaves the veth of a failed ADD: a runtime
			// cleans up with DEL at once (and retries it later if it fails).
			delStart := s.phase.Load()
			delErr := s.c.DelCNIContainer(ctx, ct)
			delEnd := s.phase.Load()
			if delErr == nil && delStart == phaseDead && delEnd == phaseDead {
				t.Errorf("worker %d: cleanup DEL of %s succeeded while the agent was dead", w, ct.Name)
			}
			s.mu.Lock()
			if start == phaseDead && end == phaseDead {
				s.outageAdds++
			}
			s.addFailed = append(s.addFailed, ct)
			s.mu.Unlock()
			continue
		}
		ct := mine[0]
		mine = mine[1:]
		err := s.c.DelCNIContainer(ctx, ct)
		end := s.phase.Load()
		s.mu.Lock()
		if err == nil {
			if start == phaseDead && end == phaseDead {
				t.Errorf("worker %d: DEL %s succeeded while the agent was dead", w, ct.Name)
			}
			s.live = slices.DeleteFunc(s.live, func(x *labcluster.Container) bool { return x == ct })
			s.ok++
		} else {
			if end == phaseUp || start == phaseReady {
				t.Errorf("worker %d: DEL failed with the agent up: %v", w, err)
			}
			if start == phaseDead && end == phaseDead {
				s.outageDels++
			}
			s.delFailed = append(s.delFailed, ct)
		}
		s.mu.Unlock()
	}
}

// retry does what a runtime does once the agent is back: it retries every
// failed DEL until it succeeds; of the failed ADDs, it cleans up and
// attaches again every other one (the same container id), and gives up on
// the rest (a runtime that lost track of them, or moved on to a new
// sandbox), which only GC can clean up.
func (s *stream) retry(ctx context.Context, t *testing.T) {
	t.Helper()
	del := func(ct *labcluster.Container) {
		t.Helper()
		err := retry.Until(ctx, 100*time.Millisecond, func() error { return s.c.DelCNIContainer(ctx, ct) })
		if err != nil {
			t.Fatalf("retried DEL of %s: %v", ct.Name, err)
		}
	}
	for _, ct := range s.delFailed {
		del(ct)
		s.live = slices.DeleteFunc(s.live, func(x *labcluster.Container) bool { return x == ct })
	}
	for i, ct := range s.addFailed {
		if i%2 == 1 {
			s.abandoned = append(s.abandoned, ct)
			continue
		}
		del(ct)
		err := retry.Until(ctx, 100*time.Millisecond, func() error {
			err := s.c.CNIAdd(ctx, ct)
			if err != nil && labcluster.CNICode(err) != types.ErrTryAgainLater {
				return retry.Permanent(err)
			}
			return err
		})
		if err != nil {
			t.Fatalf("retried ADD of %s: %v", ct.Name, err)
		}
		s.live = append(s.live, ct)
	}
}
