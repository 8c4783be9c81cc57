package state

import (
	"sync"
	"time"
)

// Rounds of the changes watch.
//
// Every commit closes the table's Changed channel; a watcher answered at
// once for each would, in a burst of 100 registrations committed in 50
// batches, be answered 50 times, and each round costs every watcher a TLS
// write, a request and a wake-up (about 0.1 ms each on the masters and
// their clients: a second per round at 10,000). Watchers that have news
// wait instead for the round that holds it: a round is released once the
// state index has been still for roundQuiet, or roundMaxHold after it
// began, whichever comes first, so a burst is served in a few answers
// each, and one change reaches its watchers roundQuiet later than it
// would alone.

const (
	// roundQuiet: a round is released once no change came for this long.
	roundQuiet = 10 * time.Millisecond
	// roundMaxHold: a round is released at the latest this long after its
	// first news, however long the burst.
	roundMaxHold = 60 * time.Millisecond
)

// roundGate holds the pending round; it is not replicated.
type roundGate struct {
	mu sync.Mutex
	// open is closed when the pending round is released; nil: none pending.
	open  chan struct{}
	began time.Time
	seen  uint64 // the state index at the last look
	// released is the state index the last round released: news up to it
	// goes out at once.
	released uint64
}

// closedRound is a released round.
var closedRound = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Round returns a channel closed when the round that holds the state index
// index is released (at once if one already was). A changes watcher that
// saw the state pass its since waits for it before it is answered.
func (t *LeaseTable) Round(index uint64) <-chan struct{} {
	t.mu.RLock()
	g := t.cache.rounds
	t.mu.RUnlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	if index <= g.released {
		return closedRound
	}
	if g.open == nil {
		g.open, g.began, g.seen = make(chan struct{}), time.Now(), index
		time.AfterFunc(roundQuiet, func() { g.tick(t) })
	}
	return g.open
}

// tick releases the pending round when the index stood still since the
// last look or the round is old enough, and looks again later otherwise.
func (g *roundGate) tick(t *LeaseTable) {
	index := t.Index()
	g.mu.Lock()
	defer g.mu.Unlock()
	if index != g.seen && time.Since(g.began) < roundMaxHold {
		g.seen = index
		time.AfterFunc(roundQuiet, func() { g.tick(t) })
		return
	}
	close(g.open)
	g.open, g.released = nil, max(g.released, index)
}
