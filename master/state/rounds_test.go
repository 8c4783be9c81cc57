package state

import (
	"fmt"
	"sync"
	"testing"

	"github.com/carve-net/carve/test/lab/testutil"
)

// TestRoundsReleaseEveryWatcher: watchers with news, asking for their
// rounds while a burst is applied, are all released, each with the state
// at or past its news; news up to a released index goes out at once; a
// reset (a restore) leaves the waiters of the old round released too.
func TestRoundsReleaseEveryWatcher(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	const watchers = 50
	var wg sync.WaitGroup
	released := make(chan uint64, watchers*20)
	for i := range 20 {
		h.mustRegister(fmt.Sprintf("a%d", i), fmt.Sprintf("198.18.0.%d", i+1))
		news := h.table.Index()
		for range watchers / 10 {
			wg.Go(func() {
				<-h.table.Round(news)
				released <- news
			})
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	testutil.Eventually(t, 0, "every watcher released", func() error {
		select {
		case <-done:
			return nil
		default:
			return fmt.Errorf("%d of %d released", len(released), 20*watchers/10)
		}
	})
	// Once released, news up to that index is not held again.
	testutil.Eventually(t, 0, "the last index released", func() error {
		select {
		case <-h.table.Round(h.table.Index()):
			return nil
		default:
			return fmt.Errorf("index %d held", h.table.Index())
		}
	})

	// A round pending at a reset still releases its waiters.
	h.mustRegister("late", "198.18.1.1")
	pending := h.table.Round(h.table.Index())
	h.table.mu.Lock()
	h.table.cache = newStateCache()
	h.table.mu.Unlock()
	testutil.Eventually(t, 0, "the round pending at the reset released", func() error {
		select {
		case <-pending:
			return nil
		default:
			return fmt.Errorf("held")
		}
	})
}
