package state

import (
	"fmt"
	"sync"
	"testing"
	"time"

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
				round := h.table.Round(news)
				<-round.C
				released <- news
				round.Done()
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
		case <-h.table.Round(h.table.Index()).C:
			return nil
		default:
			return fmt.Errorf("index %d held", h.table.Index())
		}
	})

	// A round pending at a reset still releases its waiters.
	h.mustRegister("late", "198.18.1.1")
	pending := h.table.Round(h.table.Index()).C
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

// TestRoundsWaitForTheLastWave: the next round is released only once the
// last one's wave is answered (all but one of its tickets done, or waveCap
// after its release) and as long again has passed; a ticket of a round
// not released yet, or one done twice over waves, counts for nothing.
func TestRoundsWaitForTheLastWave(t *testing.T) {
	h := newHarness(t, DefaultConfig())
	g := h.table.cache.rounds
	var mu sync.Mutex
	now := time.Unix(1_000_000, 0)
	g.mu.Lock()
	g.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	g.mu.Unlock()
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	released := func(tk RoundTicket) bool {
		t.Helper()
		g.tick(h.table) // the gate's own ticks decide the same: they read the same clock
		select {
		case <-tk.C:
			return true
		default:
			return false
		}
	}

	// The first round: no wave before it, released once the index is still.
	h.mustRegister("a1", "198.18.0.1")
	first := []RoundTicket{h.table.Round(h.table.Index()), h.table.Round(h.table.Index()), h.table.Round(h.table.Index())}
	if !released(first[0]) {
		t.Fatal("the first round was held with no wave before it")
	}

	// The next round waits while the wave is unanswered...
	h.mustRegister("a2", "198.18.0.2")
	second := h.table.Round(h.table.Index())
	secondToo := h.table.Round(h.table.Index())
	advance(roundMaxHold)
	if released(second) {
		t.Fatal("the next round was released while the last wave was unanswered")
	}
	// ... until all but one of its three tickets are done, 100 ms in, and
	// then for as long again.
	advance(100*time.Millisecond - roundMaxHold)
	first[0].Done()
	if released(second) {
		t.Fatal("released with one of three answered")
	}
	first[1].Done()
	advance(99 * time.Millisecond)
	if released(second) {
		t.Fatal("released before the wave's length passed again")
	}
	advance(time.Millisecond)
	if !released(second) {
		t.Fatal("not released once the wave was answered and as long again passed")
	}
	first[2].Done() // late: counts for nothing now

	// A wave whose tickets are never done (second and secondToo)
	// counts as answered waveCap after its release; the gap after it is
	// waveCap too.
	h.mustRegister("a3", "198.18.0.3")
	third := h.table.Round(h.table.Index())
	advance(2*waveCap - time.Millisecond)
	if released(third) {
		t.Fatal("released before twice waveCap with the wave unanswered")
	}
	advance(time.Millisecond)
	if !released(third) {
		t.Fatal("not released twice waveCap after an unanswered wave")
	}
	second.Done()
	secondToo.Done()
	third.Done()

	// A watcher that leaves before its round is released is not expected
	// in its wave: of three tickets one left, so one answer of the other
	// two answers the wave (all but one), and the next round goes at once.
	h.mustRegister("a4", "198.18.0.4")
	leaves, stays, slow := h.table.Round(h.table.Index()), h.table.Round(h.table.Index()), h.table.Round(h.table.Index())
	leaves.Done()
	if !released(stays) {
		t.Fatal("held after a wave answered at its release")
	}
	stays.Done()
	h.mustRegister("a5", "198.18.0.5")
	next := h.table.Round(h.table.Index())
	if !released(next) {
		t.Fatal("the next round held: the watcher that left before its round was counted in the wave")
	}
	slow.Done()
	next.Done()
}
