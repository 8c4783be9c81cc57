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
//
// Waves: the answers of a released round are its wave. With tens of
// thousands of watchers on a master, one wave takes the master's cores for
// a second or more, and rounds released every roundMaxHold kept every
// watcher writing for as long as a burst lasted: the commits of the burst,
// whose requests, Raft and state machine queue behind those goroutines,
// crawled (100 registrations took 53 s at 50,000 streams on one 2-core
// machine, 0.2 s with none). So the next round is released only once the
// last wave is answered (all but 1/64 of its watchers, and all but one: a
// client that does not read holds up only its own answer) and as long
// again has passed (at most waveCap), so the fan-out takes about half of a
// master's time while commits come; a wave counts as answered waveCap
// after its release at the latest. One change after a quiet spell goes out
// as before.

const (
	// roundQuiet: a round is released once no change came for this long.
	roundQuiet = 10 * time.Millisecond
	// roundMaxHold: a round is released at the latest this long after its
	// first news, however long the burst (once the last wave allows).
	roundMaxHold = 60 * time.Millisecond
	// waveCap: a wave counts as answered this long after its release at
	// the latest, whatever its slowest watchers do.
	waveCap = 5 * time.Second
)

// roundGate holds the pending round and the last wave; it is not
// replicated.
type roundGate struct {
	mu sync.Mutex
	// open is closed when the pending round is released; nil: none pending.
	open    chan struct{}
	began   time.Time
	seen    uint64 // the state index at the last look
	waiting int    // tickets of the pending round
	// released is the state index the last round released: news up to it
	// goes out at once.
	released uint64

	// The last wave: the answers of the last round released.
	wave      uint64    // its number (0: none yet)
	waveStart time.Time // its release
	expected  int       // its tickets
	answered  int       // of them done
	waveEnd   time.Time // when it counted as answered (zero: not yet)

	now func() time.Time // the clock (nil: time.Now); tests set it
}

// clock reads the gate's clock.
func (g *roundGate) clock() time.Time {
	if g.now == nil {
		return time.Now()
	}
	return g.now()
}

// closedRound is a released round.
var closedRound = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// A RoundTicket is a watcher's place in a round: C is closed when the
// round is released. The watcher calls Done once it has written its answer
// (or left without one): the next round waits for the wave's answers.
type RoundTicket struct {
	C    <-chan struct{}
	gate *roundGate
	wave uint64 // the wave it belongs to once released (0: none)
}

// Done tells the gate that the ticket's answer is written (or will not be).
func (t RoundTicket) Done() {
	if t.gate != nil && t.wave != 0 {
		t.gate.answer(t.wave)
	}
}

// Round returns the ticket of the round that holds the state index index:
// its channel is closed when the round is released (at once if one
// already was). A changes watcher that saw the state pass its since waits
// for it before it is answered, and calls Done after.
func (t *LeaseTable) Round(index uint64) RoundTicket {
	t.mu.RLock()
	g := t.cache.rounds
	t.mu.RUnlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	if index <= g.released {
		return RoundTicket{C: closedRound}
	}
	if g.open == nil {
		g.open, g.began, g.seen, g.waiting = make(chan struct{}), g.clock(), index, 0
		time.AfterFunc(roundQuiet, func() { g.tick(t) })
	}
	g.waiting++
	// The pending round becomes wave g.wave+1 when it is released.
	return RoundTicket{C: g.open, gate: g, wave: g.wave + 1}
}

// answer counts one answer of wave; the caller does not hold g.mu.
func (g *roundGate) answer(wave uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if wave == g.wave+1 && g.open != nil {
		g.waiting-- // its watcher left before the round was released: not expected
		return
	}
	if wave != g.wave {
		return // a ticket of an older wave
	}
	g.answered++
	g.checkAnswered(g.clock())
}

// checkAnswered marks the wave answered once all but 1/64 of its tickets
// are done; the caller holds g.mu.
func (g *roundGate) checkAnswered(now time.Time) {
	if g.waveEnd.IsZero() && g.answered >= g.expected-max(1, g.expected/64) {
		g.waveEnd = now
	}
}

// nextWave is the earliest time the next round may be released: the last
// wave answered (or waveCap after it began), and as long again (at most
// waveCap); the caller holds g.mu.
func (g *roundGate) nextWave() time.Time {
	if g.wave == 0 {
		return time.Time{}
	}
	end := g.waveEnd
	if end.IsZero() || end.Sub(g.waveStart) > waveCap {
		end = g.waveStart.Add(waveCap)
	}
	return end.Add(end.Sub(g.waveStart))
}

// tick releases the pending round when the index stood still since the
// last look or the round is old enough, and the last wave allows it; it
// looks again later otherwise.
func (g *roundGate) tick(t *LeaseTable) {
	index := t.Index()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.open == nil {
		return // released already
	}
	now := g.clock()
	stirring := index != g.seen && now.Sub(g.began) < roundMaxHold
	g.seen = index
	if stirring || now.Before(g.nextWave()) {
		time.AfterFunc(roundQuiet, func() { g.tick(t) })
		return
	}
	close(g.open)
	g.open, g.released = nil, max(g.released, index)
	g.wave++
	g.waveStart, g.expected, g.answered, g.waveEnd = now, g.waiting, 0, time.Time{}
	g.waiting = 0
	g.checkAnswered(now)
}
