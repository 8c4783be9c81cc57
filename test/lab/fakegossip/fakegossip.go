// Package fakegossip is an in-process gossip network implementing
// gossip.Router, for tests: any number of peers in one process, with random
// delays, drops, duplicates and reordering drawn from a seed, and none of
// mesh's data races. Every peer can reach every other directly.
//
// The faults of the n-th message on a link (from, to) are a function of the
// seed, the link and n, so a seed replays the same fault pattern as long as
// the peers send in the same order; print it when a test fails.
package fakegossip

import (
	"container/heap"
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/carve-net/carve/gossip"
)

// Config sets the faults of a network.
type Config struct {
	// Seed fixes every random choice: faults, delays, gossip targets.
	Seed uint64
	// Each message is delayed by a uniform draw in [MinDelay, MaxDelay].
	MinDelay, MaxDelay time.Duration
	// DropRate is the probability that a message is lost.
	DropRate float64
	// DuplicateRate is the probability that a message arrives twice.
	DuplicateRate float64
	// ReorderRate is the probability that a message is held back by one
	// to five MaxDelay more, behind messages sent after it.
	ReorderRate float64
	// Fanout is how many random peers a gossip goes to; 0 means 3.
	Fanout int
	// GossipInterval makes every peer gossip its complete state
	// periodically, like mesh does; 0 means only on GossipRound.
	GossipInterval time.Duration
	// Logger receives handler errors; nil discards them.
	Logger *slog.Logger
}

// Stats counts what the network did.
type Stats struct {
	Sent, Delivered, Dropped, Duplicated, Reordered int
}

type kind int

const (
	kindGossip kind = iota
	kindBroadcast
	kindUnicast
)

type message struct {
	at                time.Time
	seq               uint64
	from, to, channel string
	kind              kind
	payload           []byte
}

type queue []*message

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	return q[i].seq < q[j].seq
}
func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *queue) Push(x any)   { *q = append(*q, x.(*message)) }
func (q *queue) Pop() any {
	old := *q
	m := old[len(old)-1]
	*q = old[:len(old)-1]
	return m
}

// Network is a set of fake routers that reach each other.
type Network struct {
	cfg  Config
	log  *slog.Logger
	wake chan struct{}
	done chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	routers map[string]*Router
	q       queue
	seq     uint64
	links   map[[2]string]uint64
	rng     *rand.Rand // gossip targets
	pending int        // queued, in an inbox, or being handled
	idle    chan struct{}
	stats   Stats
	closed  bool
}

// New starts a network; Close stops it.
func New(cfg Config) *Network {
	if cfg.Fanout == 0 {
		cfg.Fanout = 3
	}
	if cfg.MaxDelay < cfg.MinDelay {
		cfg.MaxDelay = cfg.MinDelay
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	n := &Network{
		cfg:     cfg,
		log:     log,
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
		routers: map[string]*Router{},
		links:   map[[2]string]uint64{},
		rng:     rand.New(rand.NewPCG(cfg.Seed, 0x9e3779b97f4a7c15)),
	}
	n.wg.Add(1)
	go n.schedule()
	if cfg.GossipInterval > 0 {
		n.wg.Add(1)
		go n.tick()
	}
	return n
}

// Seed is the seed the network draws from, to print when a test fails.
func (n *Network) Seed() uint64 { return n.cfg.Seed }

// Stats returns the counters so far.
func (n *Network) Stats() Stats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stats
}

// Close stops the network; messages in flight are lost.
func (n *Network) Close() {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return
	}
	n.closed = true
	n.mu.Unlock()
	close(n.done)
	n.wg.Wait()
}

// Join adds a peer.
func (n *Network) Join(id string) (*Router, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, gossip.ErrStopped
	}
	if id == "" {
		return nil, fmt.Errorf("fakegossip: empty peer id")
	}
	if _, ok := n.routers[id]; ok {
		return nil, fmt.Errorf("fakegossip: peer %q already joined", id)
	}
	r := &Router{n: n, id: id, handlers: map[string]gossip.Handler{}, inbox: make(chan *message, 1024)}
	n.routers[id] = r
	n.wg.Add(1)
	go r.run()
	return r, nil
}

// Leave removes a peer, as if it crashed: what is in flight to it is lost,
// and it neither sends nor receives any more.
func (n *Network) Leave(id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if r, ok := n.routers[id]; ok {
		r.left = true
		delete(n.routers, id)
	}
}

// GossipRound makes every peer gossip the complete state of every channel
// once, as mesh does every gossip interval.
func (n *Network) GossipRound() {
	n.mu.Lock()
	rs := make([]*Router, 0, len(n.routers))
	for _, r := range n.routers {
		rs = append(rs, r)
	}
	n.mu.Unlock()
	sort.Slice(rs, func(i, j int) bool { return rs[i].id < rs[j].id })
	for _, r := range rs {
		for _, name := range r.channelNames() {
			if d := r.handler(name).Gossip(); d != nil {
				r.send(name, kindGossip, d, "")
			}
		}
	}
}

// WaitIdle blocks until no message is in flight nor being handled.
func (n *Network) WaitIdle(ctx context.Context) error {
	for {
		n.mu.Lock()
		if n.pending == 0 {
			n.mu.Unlock()
			return nil
		}
		if n.idle == nil {
			n.idle = make(chan struct{})
		}
		idle := n.idle
		n.mu.Unlock()
		select {
		case <-idle:
		case <-ctx.Done():
			return fmt.Errorf("fakegossip: waiting for idle: %w", ctx.Err())
		case <-n.done:
			return gossip.ErrStopped
		}
	}
}

func (n *Network) finish() {
	n.mu.Lock()
	n.pending--
	if n.pending == 0 && n.idle != nil {
		close(n.idle)
		n.idle = nil
	}
	n.mu.Unlock()
}

func (n *Network) tick() {
	defer n.wg.Done()
	t := time.NewTicker(n.cfg.GossipInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			n.GossipRound()
		case <-n.done:
			return
		}
	}
}

// linkRand returns the random source of the next message on a link.
func (n *Network) linkRand(from, to string) *rand.Rand {
	k := [2]string{from, to}
	seq := n.links[k]
	n.links[k] = seq + 1
	h := fnv.New64a()
	h.Write([]byte(from))
	h.Write([]byte{0})
	h.Write([]byte(to))
	return rand.New(rand.NewPCG(n.cfg.Seed^h.Sum64(), seq))
}

func (n *Network) delay(rng *rand.Rand) time.Duration {
	d := n.cfg.MinDelay
	if span := n.cfg.MaxDelay - n.cfg.MinDelay; span > 0 {
		d += time.Duration(rng.Int64N(int64(span) + 1))
	}
	return d
}

// enqueue puts one message on the wire, with its faults. Called with n.mu.
func (n *Network) enqueue(m message) {
	rng := n.linkRand(m.from, m.to)
	n.stats.Sent++
	if rng.Float64() < n.cfg.DropRate {
		n.stats.Dropped++
		return
	}
	copies := 1
	if rng.Float64() < n.cfg.DuplicateRate {
		copies = 2
		n.stats.Duplicated++
	}
	now := time.Now()
	for range copies {
		c := m
		d := n.delay(rng)
		if rng.Float64() < n.cfg.ReorderRate {
			d += n.cfg.MaxDelay + time.Duration(rng.Int64N(int64(4*n.cfg.MaxDelay)+1))
			n.stats.Reordered++
		}
		c.at = now.Add(d)
		n.seq++
		c.seq = n.seq
		heap.Push(&n.q, &c)
		n.pending++
	}
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

// schedule hands every message to its recipient when its time comes.
func (n *Network) schedule() {
	defer n.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		n.mu.Lock()
		var due *message
		wait := time.Duration(-1)
		if len(n.q) > 0 {
			if d := time.Until(n.q[0].at); d <= 0 {
				due = heap.Pop(&n.q).(*message)
			} else {
				wait = d
			}
		}
		var to *Router
		if due != nil {
			to = n.routers[due.to]
		}
		n.mu.Unlock()
		if due != nil {
			if to == nil {
				n.finish() // the peer left
				continue
			}
			select {
			case to.inbox <- due:
			case <-n.done:
				return
			}
			continue
		}
		var tc <-chan time.Time
		if wait >= 0 {
			timer.Reset(wait)
			tc = timer.C
		}
		select {
		case <-tc:
		case <-n.wake:
			timer.Stop() // since Go 1.23 no stale tick stays behind
		case <-n.done:
			return
		}
	}
}

// Router is one peer of a fake network; it implements gossip.Router.
type Router struct {
	n     *Network
	id    string
	inbox chan *message

	// guarded by n.mu
	handlers map[string]gossip.Handler
	left     bool
	targets  map[string]bool // addresses given to Connect and not forgotten
}

var _ gossip.Router = (*Router)(nil)

// Self is the peer's id.
func (r *Router) Self() string { return r.id }

// Start does nothing: a fake router delivers from the moment it joins. It
// exists so that a fake router can stand where a mesh router is started.
func (r *Router) Start() error { return nil }

// Connect records the addresses, as mesh keeps them to retry; delivery
// does not depend on them: every peer of the fake network reaches every
// other.
func (r *Router) Connect(addrs ...string) error {
	r.n.mu.Lock()
	defer r.n.mu.Unlock()
	if r.left {
		return gossip.ErrStopped
	}
	if r.targets == nil {
		r.targets = map[string]bool{}
	}
	for _, a := range addrs {
		r.targets[a] = true
	}
	return nil
}

// Forget drops addresses given to Connect, as mesh's ForgetConnections does.
func (r *Router) Forget(addrs ...string) error {
	r.n.mu.Lock()
	defer r.n.mu.Unlock()
	if r.left {
		return gossip.ErrStopped
	}
	for _, a := range addrs {
		delete(r.targets, a)
	}
	return nil
}

// Targets returns the addresses given to Connect, sorted, as a mesh router
// would keep trying them.
func (r *Router) Targets() []string {
	r.n.mu.Lock()
	defer r.n.mu.Unlock()
	out := make([]string, 0, len(r.targets))
	for a := range r.targets {
		out = append(out, a)
	}
	sort.Strings(out)
	return out
}

// Stop leaves the network, as a stopped mesh router does.
func (r *Router) Stop() error {
	r.n.Leave(r.id)
	return nil
}

// Channel registers a channel handler; unlike mesh, any time is fine.
func (r *Router) Channel(name string, h gossip.Handler) (gossip.Channel, error) {
	r.n.mu.Lock()
	defer r.n.mu.Unlock()
	if _, ok := r.handlers[name]; ok {
		return nil, fmt.Errorf("%w: %q", gossip.ErrDuplicateChannel, name)
	}
	r.handlers[name] = h
	return &channel{r: r, name: name}, nil
}

// Peers returns the other peers of the network, sorted.
func (r *Router) Peers() []string {
	r.n.mu.Lock()
	defer r.n.mu.Unlock()
	out := make([]string, 0, len(r.n.routers))
	for id := range r.n.routers {
		if id != r.id {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

func (r *Router) channelNames() []string {
	r.n.mu.Lock()
	defer r.n.mu.Unlock()
	if r.left {
		return nil
	}
	out := make([]string, 0, len(r.handlers))
	for name := range r.handlers {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

func (r *Router) handler(name string) gossip.Handler {
	r.n.mu.Lock()
	defer r.n.mu.Unlock()
	return r.handlers[name]
}

func (r *Router) run() {
	defer r.n.wg.Done()
	for {
		select {
		case m := <-r.inbox:
			r.deliver(m)
			r.n.finish()
		case <-r.n.done:
			return
		}
	}
}

func (r *Router) deliver(m *message) {
	r.n.mu.Lock()
	h, left := r.handlers[m.channel], r.left
	if !left && h != nil {
		r.n.stats.Delivered++
	}
	r.n.mu.Unlock()
	if left || h == nil {
		return
	}
	log := r.n.log.With("peer", r.id, "channel", m.channel, "from", m.from)
	switch m.kind {
	case kindGossip:
		d, err := h.OnGossip(m.payload)
		if err != nil {
			log.Warn("gossip handler", "err", err)
			return
		}
		if d != nil {
			r.send(m.channel, kindGossip, d, m.from)
		}
	case kindBroadcast:
		// Everyone received the broadcast directly: nothing to relay.
		if _, err := h.OnBroadcast(m.from, m.payload); err != nil {
			log.Warn("broadcast handler", "err", err)
		}
	case kindUnicast:
		if err := h.OnUnicast(m.from, m.payload); err != nil {
			log.Warn("unicast handler", "err", err)
		}
	}
}

// send puts d on the wire: to everyone for a broadcast, to Fanout random
// peers (not skip) for gossip.
func (r *Router) send(channel string, k kind, d gossip.Data, skip string) {
	msgs := d.Encode()
	r.n.mu.Lock()
	defer r.n.mu.Unlock()
	if r.left || r.n.closed {
		return
	}
	targets := make([]string, 0, len(r.n.routers))
	for id := range r.n.routers {
		if id != r.id && id != skip {
			targets = append(targets, id)
		}
	}
	sort.Strings(targets)
	if k == kindGossip {
		r.n.rng.Shuffle(len(targets), func(i, j int) { targets[i], targets[j] = targets[j], targets[i] })
		targets = targets[:min(len(targets), r.n.cfg.Fanout)]
	}
	for _, to := range targets {
		for _, p := range msgs {
			r.n.enqueue(message{from: r.id, to: to, channel: channel, kind: k, payload: slices.Clone(p)})
		}
	}
}

type channel struct {
	r    *Router
	name string
}

func (c *channel) Broadcast(d gossip.Data) {
	if d != nil {
		c.r.send(c.name, kindBroadcast, d, "")
	}
}

func (c *channel) Gossip(d gossip.Data) {
	if d != nil {
		c.r.send(c.name, kindGossip, d, "")
	}
}

func (c *channel) Unicast(dst string, msg []byte) error {
	n := c.r.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if c.r.left || n.closed {
		return gossip.ErrStopped
	}
	if _, ok := n.routers[dst]; !ok || dst == c.r.id {
		return fmt.Errorf("%w: %s", gossip.ErrUnknownPeer, dst)
	}
	n.enqueue(message{from: c.r.id, to: dst, channel: c.name, kind: kindUnicast, payload: slices.Clone(msg)})
	return nil
}
